"""The Triton kernels of the speculative decode tail and their launch (no checks): see
interface.py for the math and shapes. Two kernels and the group norm's:

- the conv kernel: one program per (sequence, channel block) reads the accepted window of
  the conv state once, convolves the sequence's tokens from registers and writes the new
  window (the taps it holds, then the tokens);
- the state-update kernel: one program per (sequence, tile of the (head, row) plane) reads
  the accepted token's state tile once, then per token advances it in fp32, writes it to the
  token's slot in the state's format and goes on from the stored value (the roundings of one
  token per step), and writes the gated y;
- ops/rms_norm's group kernel over every token's y.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, group_norm
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.rms_norm import kernel as norm_kernel
from vllm_nemotron_h.ops.triton_helpers import (
    load_state_tile,
    plane_tile,
    state_step,
    store_state_tile,
)


@triton.jit
def _speculative_conv_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr, out_ptr, slots_ptr, start_ptr, accepted_ptr, null_slot,
    dim, x_t, s_slot, s_dim, s_col, w_dim, w_col, o_t, sl_r,
    WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ch_ok = ch < dim
    slot = tl.load(slots_ptr + r * sl_r)
    live = (ch * 0 + slot) != null_slot  # per-channel: a scalar mask breaks the interpreter
    st_ok = ch_ok & live
    start = tl.load(start_ptr + r)
    end = tl.load(start_ptr + r + 1)
    st = state_ptr + slot * s_slot + ch * s_dim
    # The accepted window: width - 1 columns from the accepted count's offset.
    window = st + (tl.load(accepted_ptr + r) - 1) * s_col
    h0 = tl.load(window, mask=st_ok, other=0.0)
    h1 = h0
    h2 = h0
    if WIDTH >= 3:
        h1 = tl.load(window + s_col, mask=st_ok, other=0.0)
    if WIDTH >= 4:
        h2 = tl.load(window + 2 * s_col, mask=st_ok, other=0.0)
    # The new window's first width - 2 columns: the accepted window but its first column.
    if WIDTH >= 3:
        tl.store(st, h1, mask=st_ok)
    if WIDTH >= 4:
        tl.store(st + s_col, h2, mask=st_ok)
    wrow = w_ptr + ch * w_dim
    w0 = tl.load(wrow, mask=ch_ok, other=0.0).to(tl.float32)
    w1 = tl.load(wrow + w_col, mask=ch_ok, other=0.0).to(tl.float32)
    w2 = w1
    w3 = w1
    if WIDTH >= 3:
        w2 = tl.load(wrow + 2 * w_col, mask=ch_ok, other=0.0).to(tl.float32)
    if WIDTH >= 4:
        w3 = tl.load(wrow + 3 * w_col, mask=ch_ok, other=0.0).to(tl.float32)
    w_new = w1  # the weight of the token itself
    if WIDTH == 3:
        w_new = w2
    if WIDTH == 4:
        w_new = w3
    bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
    for t in range(end - start):
        tok = start + t
        xv = tl.load(x_ptr + tok * x_t + ch, mask=ch_ok, other=0.0)
        # Summed in triton_helpers.conv_window's order: the one-token tail's roundings.
        acc = w_new * xv.to(tl.float32)
        acc += w0 * h0.to(tl.float32)
        if WIDTH >= 3:
            acc += w1 * h1.to(tl.float32)
        if WIDTH >= 4:
            acc += w2 * h2.to(tl.float32)
        if HAS_BIAS:
            acc += bias
        acc = acc * tl.sigmoid(acc)
        acc = tl.where(live, acc, 0.0)
        tl.store(out_ptr + tok * o_t + ch, acc.to(out_ptr.dtype.element_ty), mask=ch_ok)
        xs = xv.to(state_ptr.dtype.element_ty)
        tl.store(st + (WIDTH - 2 + t) * s_col, xs, mask=st_ok)
        if WIDTH == 2:
            h0 = xs
        if WIDTH == 3:
            h0 = h1
            h1 = xs
        if WIDTH == 4:
            h0 = h1
            h1 = h2
            h2 = xs


@triton.jit
def _speculative_state_update_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr, z_ptr, out_ptr,
    slots_ptr, start_ptr, accepted_ptr, scale_ptr, null_slot, d_state, group_rows,
    s_slot, s_head, s_dim, x_t, x_h, x_d, dt_t, dt_h, B_t, B_g, B_n, C_t, C_g, C_n,
    z_t, z_h, z_d, o_t, o_h, o_d, sc_slot, sc_head, sc_dim, sl_r,
    HEAD_DIM: tl.constexpr, QUANTIZED: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    first_row = tl.program_id(0) * BLOCK_M
    r = tl.program_id(1).to(tl.int64)
    g = first_row // group_rows  # BLOCK_M divides group_rows: one group per program
    row_slots = slots_ptr + r * sl_r
    # The row's first slot says whether it is live (the null slot: vLLM's padding).
    _, rows, h, p, cols, col_ok, live, tile_ok = plane_tile(
        row_slots, 0, first_row, null_slot, d_state, HEAD_DIM, True, BLOCK_M, BLOCK_N
    )
    start = tl.load(start_ptr + r)
    end = tl.load(start_ptr + r + 1)
    src = tl.load(row_slots + tl.load(accepted_ptr + r) - 1)
    row_offsets = h * s_head + p * s_dim
    tile_offsets = row_offsets[:, None] + cols[None, :]
    scale_offsets = h * sc_head + p * sc_dim
    s, row_scale = load_state_tile(
        state_ptr + src * s_slot + tile_offsets, scale_ptr + src * sc_slot + scale_offsets,
        tile_ok, live, QUANTIZED,
    )  # fmt: skip
    A = tl.load(A_ptr + h)
    D = tl.load(D_ptr + h)
    dt_bias = tl.load(dt_bias_ptr + h)
    for t in range(end - start):
        tok = start + t
        x = tl.load(x_ptr + tok * x_t + h * x_h + p * x_d).to(tl.float32)
        Bv = tl.load(B_ptr + tok * B_t + g * B_g + cols * B_n, mask=col_ok, other=0.0)
        Cv = tl.load(C_ptr + tok * C_t + g * C_g + cols * C_n, mask=col_ok, other=0.0)
        z = tl.load(z_ptr + tok * z_t + h * z_h + p * z_d).to(tl.float32)
        dt = tl.load(dt_ptr + tok * dt_t + h * dt_h).to(tl.float32) + dt_bias
        new = state_step(s, row_scale, x, Bv.to(tl.float32), dt, A)
        dst = tl.load(row_slots + t)
        dst_live = live & ((rows * 0 + dst) != null_slot)
        s, row_scale = store_state_tile(
            state_ptr + dst * s_slot + tile_offsets, scale_ptr + dst * sc_slot + scale_offsets,
            new, dst_live[:, None] & col_ok[None, :], dst_live, QUANTIZED,
        )  # fmt: skip
        y = tl.sum(new * Cv.to(tl.float32)[None, :], axis=1) + D * x
        y = tl.where(live, y * z * tl.sigmoid(z), 0.0)
        tl.store(out_ptr + tok * o_t + h * o_h + p * o_d, y.to(out_ptr.dtype.element_ty))


def launch(
    layer: DecodeLayer,
    step: SpeculativeStep,
    conv_config: tuple[int, int],
    ssu_config: tuple[int, ...],
) -> torch.Tensor:
    """Launches the conv, state-update and (with ``layer.norm_weight``) group-norm kernels
    (``step.out`` given); no argument checks (the interface and the decode plan check).
    ``conv_config`` = (BLOCK_D, num_warps), ``ssu_config`` = (BLOCK_M, num_warps[, tiles]):
    the token loop runs one tile a program, whatever the plain update's tiles."""
    xbc, out, slots = step.xbc, step.out, step.state_slots
    rows = step.rows
    if rows == 0 or xbc.shape[0] == 0:
        return out
    conv = torch.empty_like(xbc)
    conv_state, weight, bias = layer.conv_state, layer.conv_weight, layer.conv_bias
    dim = xbc.shape[1]
    block_d, conv_warps = conv_config
    _speculative_conv_kernel[(rows, triton.cdiv(dim, block_d))](
        xbc, conv_state, weight, bias if bias is not None else weight, conv, slots,
        step.query_start, step.num_accepted, layer.null_slot, dim,
        xbc.stride(0), *conv_state.stride(), *weight.stride(), conv.stride(0), slots.stride(0),
        WIDTH=weight.shape[1], HAS_BIAS=bias is not None, BLOCK_D=block_d,
        num_warps=conv_warps,
    )  # fmt: skip
    state = layer.ssm_state
    _, nheads, head_dim, d_state = state.shape
    x, B, C = split_xbc(conv, nheads, head_dim, d_state)
    z, y = step.z.view(x.shape), out.view(x.shape)
    dt = step.dt
    scale = layer.ssm_scale if layer.ssm_scale is not None else layer.A.view(1, 1, -1)
    block_m, ssu_warps = ssu_config[:2]
    _speculative_state_update_kernel[(nheads * head_dim // block_m, rows)](
        state, x, dt, layer.A, B, C, layer.D, layer.dt_bias, z, y, slots, step.query_start,
        step.num_accepted, scale, layer.null_slot, d_state, nheads // B.shape[1] * head_dim,
        *state.stride()[:3], *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *z.stride(),
        *y.stride(), *scale.stride(), slots.stride(0),
        HEAD_DIM=head_dim, QUANTIZED=layer.ssm_scale is not None, BLOCK_M=block_m,
        BLOCK_N=triton.next_power_of_2(d_state), num_warps=ssu_warps,
    )  # fmt: skip
    if layer.norm_weight is not None:
        norm_kernel.launch_group(out, group_norm(layer, B.shape[1]), out=out)
    return out
