"""Selective state update: one decode step of a Mamba2 layer, all math in fp32.

For every sequence ``b``, head ``h``, row ``p`` of the head and state column ``n``::

    dt'   = softplus(dt[b, h] + dt_bias[h])
    s     = state[slot_b, h, p, n] * exp(A[h] * dt') + dt' * B[b, g, n] * x[b, h, p]
    y     = sum_n s * C[b, g, n] + D[h] * x[b, h, p]
    y    *= silu(z[b, h, p])                       (when z is given)
    state[slot_b, h, p, n] = s ;  out[b, h, p] = y

with ``g = h // (nheads // ngroups)`` and ``slot_b = state_slots[b]`` (``b`` itself when no
slots are given). Rows whose slot equals ``null_slot`` (vLLM's padding) neither read nor
write the state; their output is zero.

Shapes and dtypes:
    state      (num_slots, nheads, head_dim, d_state)  fp32 / bf16 / fp16, or int8 with
    state_scale (num_slots, nheads, head_dim) fp32      its per-row scales (ops/state_format.py:
                                                        read, advanced in fp32, re-quantized),
                                                        updated in place
    x, z, out  (batch, nheads, head_dim)               activation dtype (fp32 / bf16 / fp16)
    dt         (batch, nheads)                          activation dtype
    A, D, dt_bias (nheads,)                             fp32; A = -exp(A_log), computed at load
    B, C       (batch, ngroups, d_state)                activation dtype
    state_slots (batch,)                                int64
Supported: ops/support.py (head_dim, d_state ranges; ngroups dividing nheads).
"""

from __future__ import annotations

import functools

import torch

from vllm_nemotron_h.ops import launch_config as configs
from vllm_nemotron_h.ops.selective_state_update import kernel
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.selective_state_update.cpu import selective_state_update_cpu
from vllm_nemotron_h.ops.support import (
    ACTIVATION_DTYPES,
    ANY_STATE_DTYPES,
    D_STATE_RANGE,
    HEAD_DIM_RANGE,
    QUANTIZED_STATE_DTYPES,
    check_range,
    check_slots,
    check_tensor,
    use_triton,
)

# (BLOCK_M, num_warps, tiles per program) of one launch from the device's table:
# launch_config(device, head_dim, d_state, state_dtype, batch x heads, rows per group).
launch_config = functools.partial(configs.plane_tile_config, "selective_state_update")


def check_state_scale(
    state: torch.Tensor,
    scale: torch.Tensor | None,
    state_name: str = "state",
    scale_name: str = "state_scale",
) -> None:
    """An int8 state needs its fp32 per-row scales (state.shape[:3], on its device); a float
    state takes none."""
    if state.dtype in QUANTIZED_STATE_DTYPES:
        check_tensor(scale_name, scale, state.shape[:3], (torch.float32,), state.device)
    elif scale is not None:
        raise ValueError(
            f"{scale_name} is for an int8 state only; {state_name} has dtype {state.dtype}"
        )


def check(state: torch.Tensor, step: StateUpdateStep, state_scale: torch.Tensor | None) -> None:
    """Raises ValueError naming the first argument that does not fit."""
    check_tensor("x", step.x, (None, None, None), ACTIVATION_DTYPES)
    batch, nheads, head_dim = step.x.shape
    dev = step.x.device
    check_tensor("state", state, (None, nheads, head_dim, None), ANY_STATE_DTYPES, dev, True)
    check_state_scale(state, state_scale)
    check_range("head_dim", head_dim, HEAD_DIM_RANGE)
    check_step(step, state.shape[-1])


def check_step(
    step: StateUpdateStep, d_state: int, ngroups: int | None = None, unit_last_stride=False
) -> None:
    """Raises ValueError naming the first of the step's tensors that does not fit x's batch
    and heads, ``d_state`` and ``ngroups`` (B's when None); B, C, z and out contiguous in
    their last dimension with ``unit_last_stride``."""
    batch, nheads, head_dim = step.x.shape
    dev = step.x.device
    check_range("d_state", d_state, D_STATE_RANGE)
    check_tensor("dt", step.dt, (batch, nheads), ACTIVATION_DTYPES, dev)
    for name, t in (("A", step.A), ("D", step.D), ("dt_bias", step.dt_bias)):
        check_tensor(name, t, (nheads,), (torch.float32,), dev)
    check_tensor("B", step.B, (batch, ngroups, d_state), ACTIVATION_DTYPES, dev, unit_last_stride)
    ngroups = step.B.shape[1]
    if ngroups == 0 or nheads % ngroups:
        raise ValueError(f"B.shape[1] (ngroups={ngroups}) must divide nheads={nheads}")
    check_tensor("C", step.C, (batch, ngroups, d_state), ACTIVATION_DTYPES, dev, unit_last_stride)
    per_row = (batch, nheads, head_dim)
    if step.z is not None:
        check_tensor("z", step.z, per_row, ACTIVATION_DTYPES, dev, unit_last_stride)
    if step.out is not None:
        check_tensor("out", step.out, per_row, ACTIVATION_DTYPES, dev, unit_last_stride)
    check_slots(step.state_slots, batch, dev)


def selective_state_update(
    state: torch.Tensor,
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
    config: tuple[int, ...] | None = None,
    state_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advances ``state`` by one token in place and returns ``out`` (see module doc).
    ``config`` = (BLOCK_M, num_warps[, TILES]) overrides the device's launch table: each
    program advances TILES tiles of BLOCK_M rows (1 if not given), loading the next tile
    while it computes one. ``state_scale`` holds the per-row scales of an int8 ``state``
    (updated in place with it)."""
    step = StateUpdateStep(x, dt, A, B, C, D, dt_bias, z, state_slots, null_slot, out)
    check(state, step, state_scale)
    batch, nheads, head_dim = x.shape
    group_rows = nheads // B.shape[1] * head_dim
    if config is not None:
        check_config(config, group_rows)
    if out is None:
        step.out = torch.empty_like(x)
    if not use_triton(x):
        return selective_state_update_cpu(state, state_scale, step)
    config = config or launch_config(
        x.device, head_dim, state.shape[-1], state.dtype, batch * nheads, group_rows
    )
    return kernel.launch(state, state_scale, step, *config)


def check_config(config: tuple[int, ...], group_rows: int) -> None:
    """Raises ValueError unless ``config`` is (BLOCK_M, num_warps[, TILES]) with a program's
    BLOCK_M x TILES rows inside one group."""
    if len(config) not in (2, 3) or min(config) < 1:
        raise ValueError(f"config={config} must be (BLOCK_M, num_warps[, TILES]), each >= 1")
    block_m, _, *tiles = config
    rows = block_m * (tiles[0] if tiles else 1)
    if group_rows % rows:
        raise ValueError(
            f"config BLOCK_M x TILES = {rows} must divide heads per group x head_dim = {group_rows}"
        )
