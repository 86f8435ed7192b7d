"""The Triton kernel of the causal conv1d update and its launch (no checks): see
interface.py for the math and shapes. The new state is written from the values the program
already holds in registers: the state is read once and written once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep
from vllm_nemotron_h.ops.triton_helpers import conv_shift, conv_window


@triton.jit
def _causal_conv1d_update_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr, out_ptr, slots_ptr, null_slot, dim,
    x_b, s_slot, s_dim, s_t, w_dim, w_t, o_b,
    WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SLOTS: tl.constexpr, SILU: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ch_ok = ch < dim
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b)
    else:
        slot = b
    live = (ch * 0 + slot) != null_slot  # per-channel: a scalar mask breaks the interpreter
    st_ok = ch_ok & live
    st = state_ptr + slot * s_slot + ch * s_dim
    acc, w1, w2, xv = conv_window(
        x_ptr + b * x_b, st, s_t, ch, ch_ok, st_ok, w_ptr, w_dim, w_t, bias_ptr, WIDTH, HAS_BIAS
    )
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(live, acc, 0.0)
    conv_shift(st, s_t, w1, w2, xv, st_ok, WIDTH)
    tl.store(out_ptr + b * o_b + ch, acc.to(out_ptr.dtype.element_ty), mask=ch_ok)


def launch(step: ConvUpdateStep, block_d: int, num_warps: int) -> torch.Tensor:
    """Launches the kernel (``step.out`` given); no argument checks (the interface and the
    decode plan check)."""
    x, conv_state, weight, bias, out = step.x, step.conv_state, step.weight, step.bias, step.out
    batch, dim = x.shape
    if batch == 0:
        return out
    slots = step.state_slots
    _causal_conv1d_update_kernel[(batch, triton.cdiv(dim, block_d))](
        x, conv_state, weight, bias if bias is not None else weight, out,
        slots if slots is not None else x, step.null_slot, dim,
        x.stride(0), *conv_state.stride(), *weight.stride(), out.stride(0),
        WIDTH=weight.shape[1], HAS_BIAS=bias is not None, HAS_SLOTS=slots is not None,
        SILU=step.activation is not None, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return out
