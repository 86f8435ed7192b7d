"""The fused decode tail's Triton kernel, its workspace and its launch (no checks): see
interface.py for what it computes.

One program owns BLOCK_M consecutive rows of the (head, row) plane of one sequence, inside
one group, as in the state update's kernel: it convolves its own x channels (and rolls their
conv state) and the B and C channels of its group, which every program of the group needs.
The B and C windows may be rolled only once all of the group's programs have read them, and
the group's norm needs the sum of squares of all its rows: each program adds itself to an
arrival counter per (sequence, group) after its reads and stores, and the last to arrive
rolls the B and C windows, rescales the group's rows (from L2) and resets the counter to
zero for the next launch. The counters and the per-tile partial sums live in a
``DecodeWorkspace`` allocated once; partial sums are added in a fixed order, so the result
does not depend on which program arrives last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.mamba2_decode.layout import ngroups_of
from vllm_nemotron_h.ops.triton_helpers import (
    conv_shift,
    conv_window,
    load_state_tile,
    plane_tile,
    state_step,
    store_state_tile,
)

# The smallest tile the workspace is sized for: one partial sum per MIN_BLOCK_M rows.
MIN_BLOCK_M = 4


@dataclass
class DecodeWorkspace:
    """Scratch of ``mamba2_decode`` for up to ``max_batch`` sequences; allocate it once (CUDA
    graphs replay its addresses) and share it between layers: every launch leaves the
    counters at zero, and launches on one stream do not overlap."""

    counters: torch.Tensor  # int32 (max_batch * nheads,): arrivals per (sequence, group)
    partial_sums: torch.Tensor  # fp32 (max_batch * nheads * head_dim / MIN_BLOCK_M,)

    @classmethod
    def allocate(
        cls, max_batch: int, nheads: int, head_dim: int, device: torch.device | str
    ) -> DecodeWorkspace:
        # ngroups <= nheads, and tiles have at least MIN_BLOCK_M rows.
        return cls(
            torch.zeros(max_batch * nheads, dtype=torch.int32, device=device),
            torch.zeros(
                max_batch * nheads * head_dim // MIN_BLOCK_M, dtype=torch.float32, device=device
            ),
        )


@triton.jit
def _mamba2_decode_kernel(
    xbc_ptr, dt_ptr, z_ptr, conv_state_ptr, conv_w_ptr, conv_b_ptr, state_ptr, A_ptr, D_ptr,
    dt_bias_ptr, norm_w_ptr, out_ptr, slots_ptr, scale_ptr, counters_ptr, partials_ptr,
    null_slot, d_state, ngroups, group_rows, eps,
    xbc_b, dt_b, dt_h, z_b, cs_slot, cs_dim, cs_t, cw_dim, cw_t, s_slot, s_head, s_dim,
    sc_slot, sc_head, sc_dim, o_b,
    HEAD_DIM: tl.constexpr, QUANTIZED: tl.constexpr, WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SLOTS: tl.constexpr, NORM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILES_BLOCK: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    n_tiles = tl.num_programs(0)
    b = tl.program_id(1).to(tl.int64)
    first_row = tile * BLOCK_M
    g = first_row // group_rows  # BLOCK_M divides group_rows: one group per program
    inner = n_tiles * BLOCK_M  # nheads * head_dim: x channels come first in xbc
    slot, rows, h, p, cols, col_ok, live, tile_ok = plane_tile(
        slots_ptr, b, first_row, null_slot, d_state, HEAD_DIM, HAS_SLOTS, BLOCK_M, BLOCK_N
    )
    bc_ok = col_ok & ((cols * 0 + slot) != null_slot)  # the group's B and C channels

    # Every load before the arithmetic: the state tile, the conv windows of the tile's x
    # channels and of its group's B and C channels, then the per-row values.
    state_ptrs = state_ptr + slot * s_slot + (h * s_head + p * s_dim)[:, None] + cols[None, :]
    scale_ptrs = scale_ptr + slot * sc_slot + h * sc_head + p * sc_dim
    s, row_scale = load_state_tile(state_ptrs, scale_ptrs, tile_ok, live, QUANTIZED)
    xbc_row = xbc_ptr + b * xbc_b
    cs_base = conv_state_ptr + slot * cs_slot
    x_st = cs_base + rows * cs_dim
    b_ch = inner + g * d_state + cols
    c_ch = b_ch + ngroups * d_state
    b_st = cs_base + b_ch * cs_dim
    c_st = cs_base + c_ch * cs_dim
    x_conv, x_w1, x_w2, x_new = conv_window(
        xbc_row, x_st, cs_t, rows, rows < inner, live,
        conv_w_ptr, cw_dim, cw_t, conv_b_ptr, WIDTH, HAS_BIAS,
    )  # fmt: skip
    b_conv, b_w1, b_w2, b_new = conv_window(
        xbc_row, b_st, cs_t, b_ch, col_ok, bc_ok,
        conv_w_ptr, cw_dim, cw_t, conv_b_ptr, WIDTH, HAS_BIAS,
    )  # fmt: skip
    c_conv, c_w1, c_w2, c_new = conv_window(
        xbc_row, c_st, cs_t, c_ch, col_ok, bc_ok,
        conv_w_ptr, cw_dim, cw_t, conv_b_ptr, WIDTH, HAS_BIAS,
    )  # fmt: skip
    z = tl.load(z_ptr + b * z_b + rows).to(tl.float32)
    dt = tl.load(dt_ptr + b * dt_b + h * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + h)
    A = tl.load(A_ptr + h)
    D = tl.load(D_ptr + h)

    # The conv outputs, rounded where the separate conv kernel stores them.
    act = xbc_ptr.dtype.element_ty
    x = (x_conv * tl.sigmoid(x_conv)).to(act).to(tl.float32)
    Bv = (b_conv * tl.sigmoid(b_conv)).to(act).to(tl.float32)
    Cv = (c_conv * tl.sigmoid(c_conv)).to(act).to(tl.float32)
    conv_shift(x_st, cs_t, x_w1, x_w2, x_new, live, WIDTH)

    s = state_step(s, row_scale, x, Bv, dt, A)
    store_state_tile(state_ptrs, scale_ptrs, s, tile_ok, live, QUANTIZED)
    y = tl.sum(s * Cv[None, :], axis=1) + D * x
    y = tl.where(live, y * z * tl.sigmoid(z), 0.0).to(out_ptr.dtype.element_ty)
    out_row = out_ptr + b * o_b
    tl.store(out_row + rows, y)
    if NORM:
        yf = y.to(tl.float32)
        tl.store(partials_ptr + b * n_tiles + tile, tl.sum(yf * yf, axis=0))

    # All of this program's reads and stores are done before it counts itself in.
    tl.debug_barrier()
    counter = counters_ptr + b * ngroups + g
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    tiles_per_group = group_rows // BLOCK_M
    if arrived == tiles_per_group - 1:
        conv_shift(b_st, cs_t, b_w1, b_w2, b_new, bc_ok, WIDTH)
        conv_shift(c_st, cs_t, c_w1, c_w2, c_new, bc_ok, WIDTH)
        if NORM:
            # The group's partial sums and rows are loaded together (one round trip), from
            # L2 (.cg): other programs stored them, a stale L1 line must not answer.
            t = tl.arange(0, TILES_BLOCK)
            sq = tl.load(
                partials_ptr + b * n_tiles + g * tiles_per_group + t,
                mask=t < tiles_per_group,
                other=0.0,
                cache_modifier=".cg",
            )
            c = tl.arange(0, GROUP_BLOCK)
            c_ok = c < group_rows
            c += g * group_rows
            v = tl.load(out_row + c, mask=c_ok, other=0.0, cache_modifier=".cg")
            w = tl.load(norm_w_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / group_rows + eps)
            tl.store(out_row + c, (v.to(tl.float32) * rstd * w).to(v.dtype), mask=c_ok)
        tl.store(counter, 0)


def launch(
    layer: DecodeLayer,
    step: DecodeStep,
    workspace: DecodeWorkspace,
    block_m: int,
    num_warps: int,
) -> torch.Tensor:
    """Launches the fused kernel (``step.out`` given); no argument checks (the interface and
    the decode plan check, the workspace included)."""
    xbc, dt, z, out, slots = step.xbc, step.dt, step.z, step.out, step.state_slots
    conv_state, conv_weight, ssm_state, A = (
        layer.conv_state, layer.conv_weight, layer.ssm_state, layer.A
    )  # fmt: skip
    batch, conv_dim = xbc.shape
    _, nheads, head_dim, d_state = ssm_state.shape
    inner = nheads * head_dim
    ngroups = ngroups_of(conv_dim, nheads, head_dim, d_state)
    group_rows = inner // ngroups
    n_tiles = inner // block_m
    if batch == 0:
        return out
    scale = layer.ssm_scale if layer.ssm_scale is not None else A.view(1, 1, -1)
    bias, norm_weight = layer.conv_bias, layer.norm_weight
    _mamba2_decode_kernel[(n_tiles, batch)](
        xbc, dt, z, conv_state, conv_weight, bias if bias is not None else conv_weight,
        ssm_state, A, layer.D, layer.dt_bias, norm_weight if norm_weight is not None else A,
        out, slots if slots is not None else dt, scale, workspace.counters,
        workspace.partial_sums,
        layer.null_slot, d_state, ngroups, group_rows, layer.eps,
        xbc.stride(0), *dt.stride(), z.stride(0), *conv_state.stride(), *conv_weight.stride(),
        *ssm_state.stride()[:3], *scale.stride(), out.stride(0),
        HEAD_DIM=head_dim, QUANTIZED=layer.ssm_scale is not None, WIDTH=conv_weight.shape[1],
        HAS_BIAS=bias is not None, HAS_SLOTS=slots is not None, NORM=norm_weight is not None,
        BLOCK_M=block_m, BLOCK_N=triton.next_power_of_2(d_state),
        TILES_BLOCK=triton.next_power_of_2(n_tiles // ngroups),
        GROUP_BLOCK=triton.next_power_of_2(group_rows), num_warps=num_warps,
    )  # fmt: skip
    return out
