"""The selective state update with deferred writes: one decode step of a Mamba2 layer whose
SSM state is a checkpoint plus a ring of the tokens since (layout.py), all math in fp32.

For every sequence ``b`` (slot ``s = state_slots[b]``) and head ``h`` with ``n`` tokens in
its ring, the result is the per-step update's (ops/selective_state_update) on the state
the checkpoint and ring stand for::

    dt'  = softplus(dt[b, h] + dt_bias[h])
    S    = (checkpoint advanced through the ring) * exp(A[h] dt') + dt' x[b, h] (x) B[b, g]
    y    = S . C[b, g] + D[h] x[b, h] ;  y *= silu(z[b, h])    (when z is given)

computed without writing S: y = exp(A sum of the ring's and this token's dt) (checkpoint . C)
+ sum over the ring and this token of w_k (B_k . C) x_k, where w_k = dt_k exp(A x the dt of
the tokens after k). The token joins the ring (n + 1 tokens); when that fills it (n + 1 = L),
S is written into the checkpoint in its format instead and the ring empties. Per step a row
reads its checkpoint once and writes nothing but its ring entry (x, and dt per head, B per
group): about half of the per-step update's bytes for a float checkpoint, and with an int8
checkpoint about 1/4 of a bf16 state's; one step in L also writes the checkpoint.

``flush_deferred_state`` writes given slots' rings back into their checkpoints (before a
prefill reads the state, and wherever the whole state is needed). Rows whose slot is
``null_slot`` are skipped (their output is zero).

The step's arguments: the per-step update's record (``StateUpdateStep``, same shapes and
dtypes; x, z, out, B, C contiguous in their last dimension); the state: layout.py.
Supported: ops/support.py (head_dim, d_state, ring sizes; ngroups dividing nheads).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton

from vllm_nemotron_h.ops import launch_config as configs
from vllm_nemotron_h.ops.deferred_state_update import kernel
from vllm_nemotron_h.ops.deferred_state_update.cpu import deferred_state_update_cpu
from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState, RingFlush, ring_shapes
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.selective_state_update.interface import check_state_scale, check_step
from vllm_nemotron_h.ops.support import (
    ACTIVATION_DTYPES,
    ANY_STATE_DTYPES,
    D_STATE_RANGE,
    HEAD_DIM_RANGE,
    RING_SIZES,
    check_range,
    check_tensor,
    use_triton,
)


@configs.cached
def launch_config(
    device: torch.device, head_dim: int, d_state: int, state_dtype: torch.dtype, batch_heads: int
) -> tuple[int, int]:
    """(BLOCK_M rows of a head per tile, num_warps) from the device's table, keyed by
    "head_dim,d_state,state bytes". Untuned shapes and devices take what the H100 sweeps
    chose for every format: the whole head in one tile of 4 warps while a launch has few
    programs (batch x heads <= 128), then tiles of up to 32 rows in one warp (the kernel is
    held by its registers: small programs, many of them)."""
    rows = configs.state_rows("deferred_state_update", device, head_dim, d_state, state_dtype)
    head_rows = triton.next_power_of_2(head_dim)
    untuned = (head_rows, 4) if batch_heads <= 128 else (min(32, head_rows), 1)
    return configs.first_fit(rows, batch_heads) or untuned


@configs.cached
def pays(
    device: torch.device, head_dim: int, d_state: int, state_dtype: torch.dtype, batch_heads: int
) -> bool:
    """Whether a decode step of ``batch_heads`` (batch x heads) runs faster deferred than
    through the per-step update of the same state format on ``device``: the device table's
    ``deferred_state_update_pays`` rows ([max batch x heads, 1 or 0], keyed as the tile rows),
    measured with benchmarks/kernels/deferred_state_update.py; where the table says nothing,
    deferring pays (it moves about half the bytes)."""
    rows = configs.state_rows("deferred_state_update_pays", device, head_dim, d_state, state_dtype)
    measured = configs.first_fit(rows, batch_heads)
    return measured is None or bool(measured[0])


def check_config(config: tuple[int, int], head_dim: int) -> None:
    # The last tile of a head is masked where BLOCK_M does not divide head_dim.
    block_m, most = config[0], triton.next_power_of_2(head_dim)
    if block_m < 1 or block_m > most or block_m & (block_m - 1):
        raise ValueError(
            f"config BLOCK_M={block_m} must be a power of two up to {most} (head_dim={head_dim})"
        )


def check_state(state: DeferredState, device: torch.device | None = None) -> None:
    """Raises ValueError naming the first of the state's tensors that does not fit the
    checkpoint's shape and the ring's size."""
    if not isinstance(state, DeferredState):
        raise ValueError(f"state must be a DeferredState, got {type(state).__name__}")
    cp = state.checkpoint
    check_tensor("state.checkpoint", cp, (None, None, None, None), ANY_STATE_DTYPES, device, True)
    check_state_scale(cp, state.checkpoint_scale, "state.checkpoint", "state.checkpoint_scale")
    num_slots, nheads, head_dim, d_state = cp.shape
    check_range("head_dim", head_dim, HEAD_DIM_RANGE)
    check_range("d_state", d_state, D_STATE_RANGE)
    check_tensor("state.ring_dt", state.ring_dt, (num_slots, nheads, None), (torch.float32,))
    L = state.ring_size
    if L not in RING_SIZES:
        raise ValueError(
            f"the ring size (state.ring_dt.shape[-1]) must be in {RING_SIZES}, got {L}"
        )
    ngroups = state.ring_B.shape[1] if state.ring_B.dim() == 4 else 0
    if ngroups == 0 or nheads % ngroups:
        raise ValueError(
            f"state.ring_B must have shape (num_slots, ngroups, {L}, {d_state}) with ngroups "
            f"dividing nheads={nheads}, got {tuple(state.ring_B.shape)}"
        )
    x_shape, dt_shape, B_shape, len_shape = ring_shapes(nheads, head_dim, d_state, ngroups, L)
    for name, t, shape, dtypes in (
        ("state.ring_x", state.ring_x, x_shape, ACTIVATION_DTYPES),
        ("state.ring_dt", state.ring_dt, dt_shape, (torch.float32,)),
        ("state.ring_B", state.ring_B, B_shape, ACTIVATION_DTYPES),
        ("state.ring_len", state.ring_len, len_shape, (torch.int32,)),
    ):
        check_tensor(name, t, (num_slots, *shape), dtypes, cp.device, True)


def check(state: DeferredState, step: StateUpdateStep) -> None:
    """Raises ValueError naming the first argument that does not fit."""
    check_tensor("x", step.x, (None, None, None), ACTIVATION_DTYPES, None, True)
    check_state(state, step.x.device)
    _, nheads, head_dim, d_state = state.checkpoint.shape
    if step.x.shape[1:] != (nheads, head_dim):
        raise ValueError(
            f"x must have (nheads, head_dim) = {(nheads, head_dim)} as state.checkpoint, got "
            f"{tuple(step.x.shape[1:])}"
        )
    check_step(step, d_state, state.ring_B.shape[1], unit_last_stride=True)


def deferred_state_update(
    state: DeferredState, step: StateUpdateStep, config: tuple[int, int] | None = None
) -> torch.Tensor:
    """Advances every row's state by one token (see module doc) and returns the output
    (``step.out``, allocated when None). ``config`` = (BLOCK_M, num_warps) overrides the
    device's launch table."""
    check(state, step)
    x = step.x
    batch, nheads, head_dim = x.shape
    if config is not None:
        check_config(config, head_dim)
    if step.out is None or step.state_slots is None:
        slots = step.state_slots
        step = replace(
            step,
            out=step.out if step.out is not None else torch.empty_like(x),
            state_slots=slots if slots is not None else torch.arange(batch, device=x.device),
        )
    if not use_triton(x):
        deferred_state_update_cpu(state, step)
        return step.out
    cp = state.checkpoint
    block_m, num_warps = config or launch_config(
        x.device, head_dim, cp.shape[-1], cp.dtype, batch * nheads
    )
    kernel.launch(state, step, block_m, num_warps)
    return step.out


def flush_deferred_state(
    state: DeferredState,
    A: torch.Tensor,
    state_slots: torch.Tensor,
    null_slot: int = -1,
    config: tuple[int, int] | None = None,
) -> None:
    """Writes the rings of ``state_slots`` back into their checkpoints (in the checkpoint's
    format) and empties them; null slots are skipped."""
    check_state(state)
    cp = state.checkpoint
    check_tensor("A", A, (cp.shape[1],), (torch.float32,), cp.device)
    check_tensor("state_slots", state_slots, (None,), (torch.int64,), cp.device)
    if config is not None:
        check_config(config, cp.shape[2])
    flush = RingFlush(A, state_slots, null_slot)
    if not use_triton(cp):
        deferred_state_update_cpu(state, flush)
        return
    _, nheads, head_dim, d_state = cp.shape
    block_m, num_warps = config or launch_config(
        cp.device, head_dim, d_state, cp.dtype, state_slots.shape[0] * nheads
    )
    kernel.launch(state, flush, block_m, num_warps)
