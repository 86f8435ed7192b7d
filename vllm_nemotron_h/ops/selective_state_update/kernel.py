"""The Triton kernel of the selective state update and its launch (no checks): see
interface.py for the math, shapes and supported ranges.

One Triton program owns TILES x BLOCK_M consecutive rows of the (head, row) plane of one
sequence, advanced one tile of BLOCK_M rows at a time in a software-pipelined loop (the next
tiles' state is copied in while one is computed); B, C (and, for an int8 state inside one
head, that head's dt, A and D) are loaded once for all of them. A program may span several
heads (head_dim 80 takes 32- or 64-row tiles without masked rows) but never two groups. Each
program reads its state tiles once and writes them once: the kernel moves the minimum number
of bytes. An int8 state (QUANTIZED) is read with its per-row scales, advanced in fp32 and
written back with new scales from the tile in registers: one pass still. The int8 update is
bound by instruction issue and latency rather than bytes, so it advances the rows in the old
rows' units (quantized_state_step) and loads a head's dt, A and D once per program where the
program lies in one head (PER_HEAD); the float formats, bound by their bytes, take the direct
form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.triton_helpers import (
    load_state_tile,
    plane_tile,
    quantized_state_step,
    state_step,
    store_quantized_step,
    store_state_tile,
)

# Tiles in flight in a program of several (the loop's stages): 3 was the best or within 2 % of
# it for the int8 state at batch >= 32 on the H200 (benchmarks/NOTES.md).
PIPELINE_STAGES = tl.constexpr(3)


@triton.jit
def tile_rows(rows, h, p, t, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PER_HEAD: tl.constexpr):
    """Head and row of tile ``t`` of a program whose first tile's rows are ``rows`` (head
    ``h``, row ``p``): within one head (PER_HEAD) the rows move on by t x BLOCK_M."""
    if PER_HEAD:
        return h, p + t * BLOCK_M
    rows = rows + t * BLOCK_M
    return (rows // HEAD_DIM).to(tl.int64), rows % HEAD_DIM


@triton.jit
def _selective_state_update_kernel(
    state_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    dt_bias_ptr,
    z_ptr,
    out_ptr,
    slots_ptr,
    scale_ptr,
    null_slot,
    d_state,
    group_rows,
    s_slot,
    s_head,
    s_dim,
    x_b,
    x_h,
    x_d,
    dt_b,
    dt_h,
    B_b,
    B_g,
    B_n,
    C_b,
    C_g,
    C_n,
    z_b,
    z_h,
    z_d,
    o_b,
    o_h,
    o_d,
    sc_slot,
    sc_head,
    sc_dim,
    HEAD_DIM: tl.constexpr,
    QUANTIZED: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES: tl.constexpr,
    PER_HEAD: tl.constexpr,
    INLINE_PTX: tl.constexpr,
):
    first_row = tl.program_id(0) * (BLOCK_M * TILES)
    b = tl.program_id(1).to(tl.int64)
    g = first_row // group_rows  # BLOCK_M x TILES divides group_rows: one group per program
    slot, rows, h, p, cols, col_ok, live, tile_ok = plane_tile(
        slots_ptr, b, first_row, null_slot, d_state, HEAD_DIM, HAS_SLOTS, BLOCK_M, BLOCK_N
    )
    state_base = state_ptr + slot * s_slot + cols[None, :]
    scale_base = scale_ptr + slot * sc_slot
    # One tile: every load is issued before the arithmetic, the state, its scales, the head's
    # values and x before B and C: in this order ptxas issues the state loads ~100
    # instructions earlier and the int8 update runs 11 % faster on the H100 (benchmarks/NOTES.md).
    if TILES == 1:
        s, row_scale = load_state_tile(
            state_base + (h * s_head + p * s_dim)[:, None],
            scale_base + h * sc_head + p * sc_dim,
            tile_ok, live, QUANTIZED,
        )  # fmt: skip
    if PER_HEAD:  # the program lies in one head: its values once (scalars)
        head = first_row // HEAD_DIM
        dt = tl.load(dt_ptr + b * dt_b + head * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + head)
        A = tl.load(A_ptr + head)
        D = tl.load(D_ptr + head)
    if TILES == 1:
        x = tl.load(x_ptr + b * x_b + h * x_h + p * x_d).to(tl.float32)
    Bv = tl.load(B_ptr + b * B_b + g * B_g + cols * B_n, mask=col_ok, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * C_b + g * C_g + cols * C_n, mask=col_ok, other=0.0).to(tl.float32)
    if TILES == 1 and HAS_Z:
        z = tl.load(z_ptr + b * z_b + h * z_h + p * z_d).to(tl.float32)
    # Several tiles: a software-pipelined loop, the next tiles' state and scales copied into
    # shared memory (cp.async) while one is computed.
    for t in tl.range(0, TILES, num_stages=1 if TILES == 1 else PIPELINE_STAGES):
        ht, pt = tile_rows(rows, h, p, t, HEAD_DIM, BLOCK_M, PER_HEAD)
        if TILES > 1:
            s, row_scale = load_state_tile(
                state_base + (ht * s_head + pt * s_dim)[:, None],
                scale_base + ht * sc_head + pt * sc_dim,
                tile_ok, live, QUANTIZED,
            )  # fmt: skip
            x = tl.load(x_ptr + b * x_b + ht * x_h + pt * x_d).to(tl.float32)
            if HAS_Z:
                z = tl.load(z_ptr + b * z_b + ht * z_h + pt * z_d).to(tl.float32)
        if not PER_HEAD:
            dt = tl.load(dt_ptr + b * dt_b + ht * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + ht)
            A = tl.load(A_ptr + ht)
            D = tl.load(D_ptr + ht)
        tile_ptrs = state_base + (ht * s_head + pt * s_dim)[:, None]
        tile_scales = scale_base + ht * sc_head + pt * sc_dim
        if QUANTIZED:
            u, f = quantized_state_step(s, row_scale, x, Bv, dt, A, INLINE_PTX)
            store_quantized_step(tile_ptrs, tile_scales, u, f, tile_ok, live, INLINE_PTX)
            y = f * tl.sum(u * Cv[None, :], axis=1) + D * x
        else:
            new = state_step(s, row_scale, x, Bv, dt, A)
            store_state_tile(tile_ptrs, tile_scales, new, tile_ok, live, QUANTIZED)
            y = tl.sum(new * Cv[None, :], axis=1) + D * x
        if HAS_Z:
            y = y * z * tl.sigmoid(z)
        y = tl.where(live, y, 0.0)
        tl.store(out_ptr + b * o_b + ht * o_h + pt * o_d, y.to(out_ptr.dtype.element_ty))


def takes_per_head_values(quantized: bool, head_dim: int, program_rows: int) -> bool:
    """Whether a program loads its head's dt, A and D once (PER_HEAD): an int8 state (bound
    by instruction issue) whose programs' rows (BLOCK_M x TILES) each lie in one head."""
    return quantized and head_dim % program_rows == 0


def launch(
    state: torch.Tensor,
    state_scale: torch.Tensor | None,
    step: StateUpdateStep,
    block_m: int,
    num_warps: int,
    tiles: int = 1,
) -> torch.Tensor:
    """Launches the kernel (``step.out`` given), each program advancing ``tiles`` tiles of
    ``block_m`` rows; no argument checks (the interface and the decode plan check).
    ``state_scale`` holds the per-row scales of an int8 ``state``."""
    x, z, out = step.x, step.z, step.out
    batch, nheads, head_dim = x.shape
    if batch == 0:
        return out
    d_state = state.shape[-1]
    zz = z if z is not None else x
    scale = state_scale if state_scale is not None else step.A.view(1, 1, -1)
    slots = step.state_slots
    per_head = takes_per_head_values(state_scale is not None, head_dim, block_m * tiles)
    _selective_state_update_kernel[(nheads * head_dim // (block_m * tiles), batch)](
        state, x, step.dt, step.A, step.B, step.C, step.D, step.dt_bias, zz, out,
        slots if slots is not None else x, scale,
        step.null_slot, d_state, nheads // step.B.shape[1] * head_dim,
        *state.stride()[:3], *x.stride(), *step.dt.stride(), *step.B.stride(), *step.C.stride(),
        *zz.stride(), *out.stride(), *scale.stride(),
        HEAD_DIM=head_dim, QUANTIZED=state_scale is not None, HAS_Z=z is not None,
        HAS_SLOTS=slots is not None, BLOCK_M=block_m, BLOCK_N=triton.next_power_of_2(d_state),
        TILES=tiles, PER_HEAD=per_head,
        INLINE_PTX=state.is_cuda, num_warps=num_warps,
    )  # fmt: skip
    return out
