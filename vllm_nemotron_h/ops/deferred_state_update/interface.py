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

Shapes and dtypes: as the per-step update's for x, dt, A, B, C, D, dt_bias, z, out and
state_slots (x, z, out, B, C contiguous in their last dimension); the state: layout.py.
Supported: ops/support.py (head_dim, d_state, ring sizes; ngroups dividing nheads).
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops import launch_config as configs
from vllm_nemotron_h.ops.deferred_state_update import kernel
from vllm_nemotron_h.ops.deferred_state_update.cpu import deferred_state_update_cpu
from vllm_nemotron_h.ops.deferred_state_update.layout import LEN_ROWS, DeferredState, ring_shapes
from vllm_nemotron_h.ops.selective_state_update.interface import check_state_scale
from vllm_nemotron_h.ops.support import (
    ACTIVATION_DTYPES,
    D_STATE_RANGE,
    HEAD_DIM_RANGE,
    QUANTIZED_STATE_DTYPES,
    RING_SIZES,
    STATE_DTYPES,
    check_range,
    check_slots,
    check_tensor,
    use_triton,
)


@configs.cached
def launch_config(
    device: torch.device, head_dim: int, d_state: int, state_dtype: torch.dtype, batch_heads: int
) -> tuple[int, int]:
    """(BLOCK_M rows of a head per program, num_warps), from the device's table."""
    block_m, num_warps = configs.plane_tile_config(
        "deferred_state_update", device, head_dim, d_state, state_dtype, batch_heads, head_dim
    )
    return max(block_m, LEN_ROWS), num_warps


def check_config(config: tuple[int, int], head_dim: int) -> None:
    block_m = config[0]
    if block_m % LEN_ROWS or head_dim % block_m:
        raise ValueError(
            f"config BLOCK_M={block_m} must be a multiple of {LEN_ROWS} dividing "
            f"head_dim={head_dim}"
        )


def check_state(state: DeferredState, device: torch.device | None = None) -> None:
    """Raises ValueError naming the first of the state's tensors that does not fit the
    checkpoint's shape and the ring's size."""
    if not isinstance(state, DeferredState):
        raise ValueError(f"state must be a DeferredState, got {type(state).__name__}")
    cp = state.checkpoint
    dtypes = STATE_DTYPES + QUANTIZED_STATE_DTYPES
    check_tensor("state.checkpoint", cp, (None, None, None, None), dtypes, device, True)
    check_state_scale(cp, state.checkpoint_scale, "state.checkpoint", "state.checkpoint_scale")
    num_slots, nheads, head_dim, d_state = cp.shape
    check_range("head_dim", head_dim, HEAD_DIM_RANGE)
    check_range("d_state", d_state, D_STATE_RANGE)
    if head_dim % LEN_ROWS:
        raise ValueError(
            f"a deferred state needs head_dim a multiple of {LEN_ROWS}, got {head_dim}"
        )
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


def check(state, x, dt, A, B, C, D, dt_bias, z, state_slots, out) -> None:
    """Raises ValueError naming the first argument that does not fit."""
    check_tensor("x", x, (None, None, None), ACTIVATION_DTYPES, None, True)
    batch, nheads, head_dim = x.shape
    dev = x.device
    check_state(state, dev)
    _, cp_heads, cp_dim, d_state = state.checkpoint.shape
    if (cp_heads, cp_dim) != (nheads, head_dim):
        raise ValueError(
            f"state.checkpoint must have (nheads, head_dim) = {(nheads, head_dim)} as x, got "
            f"{(cp_heads, cp_dim)}"
        )
    ngroups = state.ring_B.shape[1]
    check_tensor("dt", dt, (batch, nheads), ACTIVATION_DTYPES, dev)
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_tensor(name, t, (nheads,), (torch.float32,), dev)
    for name, t in (("B", B), ("C", C)):
        check_tensor(name, t, (batch, ngroups, d_state), ACTIVATION_DTYPES, dev, True)
    if z is not None:
        check_tensor("z", z, (batch, nheads, head_dim), ACTIVATION_DTYPES, dev, True)
    if out is not None:
        check_tensor("out", out, (batch, nheads, head_dim), ACTIVATION_DTYPES, dev, True)
    check_slots(state_slots, batch, dev)


def deferred_state_update(
    state: DeferredState,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None = None,
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Advances every row's state by one token (see module doc) and returns ``out``.
    ``config`` = (BLOCK_M, num_warps) overrides the device's launch table."""
    check(state, x, dt, A, B, C, D, dt_bias, z, state_slots, out)
    batch, nheads, head_dim = x.shape
    if out is None:
        out = torch.empty_like(x)
    if state_slots is None:
        state_slots = torch.arange(batch, device=x.device)
    if config is not None:
        check_config(config, head_dim)
    if not use_triton(x):
        deferred_state_update_cpu(
            state, x, dt, A, B, C, D, dt_bias, z, state_slots, null_slot, out
        )
        return out
    cp = state.checkpoint
    block_m, num_warps = config or launch_config(
        x.device, head_dim, cp.shape[-1], cp.dtype, batch * nheads
    )
    kernel.launch(
        state, x, dt, A, B, C, D, dt_bias, z, state_slots, null_slot, out, block_m, num_warps
    )
    return out


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
    if not use_triton(cp):
        deferred_state_update_cpu(
            state, None, None, A, None, None, None, None, None, state_slots, null_slot, None
        )
        return
    block_m, num_warps = config or launch_config(
        cp.device, cp.shape[2], cp.shape[3], cp.dtype, state_slots.shape[0] * cp.shape[1]
    )
    kernel.launch(
        state, None, None, A, None, None, None, None, None, state_slots, null_slot, None,
        block_m, num_warps,
    )  # fmt: skip
