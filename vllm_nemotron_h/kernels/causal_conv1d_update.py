"""Causal depthwise conv1d for one decode token, with the rolling conv state update.

For every sequence ``b`` and channel ``c`` with window ``w = [state[slot_b, c, :], x[b, c]]``::

    out[b, c] = act(sum_k weight[c, k] * w[k] + bias[c])
    state[slot_b, c, :] = w[1:]

The new state is written from the values the program already holds in registers: the state
is read once and written once. Rows whose slot equals ``null_slot`` neither read nor write
the state; their output is zero.

Shapes and dtypes:
    x, out      (batch, dim)                    activation dtype; out may be x (in place)
    conv_state  (num_slots, dim, width - 1)     any strides (vLLM's DS or SD layout)
    weight      (dim, width), bias (dim,)       width 2..4
    state_slots (batch,)                        int64
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.kernels._common import (
    ACTIVATION_DTYPES,
    STATE_DTYPES,
    check_range,
    check_slots,
    check_tensor,
    use_triton,
)

ACTIVATIONS = (None, "silu", "swish")

# (max batch*dim, BLOCK_D, num_warps): the best of benchmarks/kernels.py --tune on the H100
# over the three real shapes (benchmarks/results/kernel-tuning-h100.json), as
# `kernels.py --tables` derives it from that sweep.
_BIG = 1 << 62
TUNED_CONFIGS: list[tuple[int, int, int]] = [
    (196608, 128, 4),
    (327680, 512, 4),
    (393216, 256, 4),
    (786432, 512, 4),
    (_BIG, 256, 2),
]


def launch_config(batch_dim: int) -> tuple[int, int]:
    """(BLOCK_D, num_warps) for one launch over ``batch_dim`` = batch x channels."""
    return next((bd, w) for max_bd, bd, w in TUNED_CONFIGS if batch_dim <= max_bd)


@triton.jit
def _conv_window(
    x_row_ptr,
    st,
    s_t,
    ch,
    ch_ok,
    st_ok,
    w_ptr,
    w_dim,
    w_t,
    bias_ptr,
    WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Loads one token's window of channels ``ch`` (state taps at ``st + k * s_t``, the new
    value at ``x_row_ptr + ch``) and convolves it in fp32, before the activation. Returns
    (conv, w1, w2, xv): the taps the state shift writes (w1, w2 unused below WIDTH 3, 4)."""
    xv = tl.load(x_row_ptr + ch, mask=ch_ok, other=0.0)
    w0 = tl.load(st, mask=st_ok, other=0.0)
    w1 = w0
    w2 = w0
    if WIDTH >= 3:
        w1 = tl.load(st + s_t, mask=st_ok, other=0.0)
    if WIDTH >= 4:
        w2 = tl.load(st + 2 * s_t, mask=st_ok, other=0.0)
    wrow = w_ptr + ch * w_dim
    acc = tl.load(wrow + (WIDTH - 1) * w_t, mask=ch_ok, other=0.0).to(tl.float32) * xv.to(
        tl.float32
    )
    acc += tl.load(wrow, mask=ch_ok, other=0.0).to(tl.float32) * w0.to(tl.float32)
    if WIDTH >= 3:
        acc += tl.load(wrow + w_t, mask=ch_ok, other=0.0).to(tl.float32) * w1.to(tl.float32)
    if WIDTH >= 4:
        acc += tl.load(wrow + 2 * w_t, mask=ch_ok, other=0.0).to(tl.float32) * w2.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
    return acc, w1, w2, xv


@triton.jit
def _conv_shift(st, s_t, w1, w2, xv, mask, WIDTH: tl.constexpr):
    """Rolls the window from registers (the taps _conv_window returned): no second read."""
    sty = st.dtype.element_ty
    if WIDTH == 2:
        tl.store(st, xv.to(sty), mask=mask)
    if WIDTH == 3:
        tl.store(st, w1, mask=mask)
        tl.store(st + s_t, xv.to(sty), mask=mask)
    if WIDTH == 4:
        tl.store(st, w1, mask=mask)
        tl.store(st + s_t, w2, mask=mask)
        tl.store(st + 2 * s_t, xv.to(sty), mask=mask)


@triton.jit
def _causal_conv1d_update_kernel(
    x_ptr,
    state_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    slots_ptr,
    null_slot,
    dim,
    x_b,
    s_slot,
    s_dim,
    s_t,
    w_dim,
    w_t,
    o_b,
    WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
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
    acc, w1, w2, xv = _conv_window(
        x_ptr + b * x_b, st, s_t, ch, ch_ok, st_ok, w_ptr, w_dim, w_t, bias_ptr, WIDTH, HAS_BIAS
    )
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(live, acc, 0.0)
    _conv_shift(st, s_t, w1, w2, xv, st_ok, WIDTH)
    tl.store(out_ptr + b * o_b + ch, acc.to(out_ptr.dtype.element_ty), mask=ch_ok)


def causal_conv1d_update_ref(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-PyTorch reference with the same signature and effects (the CPU path)."""
    batch = x.shape[0]
    slots = state_slots if state_slots is not None else torch.arange(batch, device=x.device)
    live = slots != null_slot
    idx = slots[live]
    window = torch.cat([conv_state[idx], x[live, :, None].to(conv_state.dtype)], dim=-1)
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = torch.nn.functional.silu(y)
    conv_state[idx] = window[..., 1:]
    if out is None:
        out = torch.empty_like(x)
    out.zero_()
    out[live] = y.to(out.dtype)
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Convolves one new token per sequence and rolls ``conv_state`` in place.
    ``config`` = (BLOCK_D, num_warps) overrides the tuned launch configuration."""
    check_tensor("x", x, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    batch, dim = x.shape
    dev = x.device
    check_tensor("weight", weight, (dim, None), ACTIVATION_DTYPES, dev)
    width = weight.shape[1]
    check_range("weight.shape[1] (conv width)", width, 2, 4)
    check_tensor("conv_state", conv_state, (None, dim, width - 1), STATE_DTYPES, dev)
    if bias is not None:
        check_tensor("bias", bias, (dim,), ACTIVATION_DTYPES, dev)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    check_slots(state_slots, batch, dev)
    if out is None:
        out = torch.empty_like(x)
    else:
        check_tensor("out", out, (batch, dim), ACTIVATION_DTYPES, dev, unit_last_stride=True)
    if not use_triton(x):
        return causal_conv1d_update_ref(
            x, conv_state, weight, bias, activation, state_slots, null_slot, out
        )
    return launch_causal_conv1d_update(
        x, conv_state, weight, bias, activation, state_slots, null_slot, out, config
    )


def launch_causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    state_slots: torch.Tensor | None,
    null_slot: int,
    out: torch.Tensor,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The Triton launch of ``causal_conv1d_update`` without its argument checks, for a
    caller that has checked the same arguments already (``mamba2_decode``)."""
    batch, dim = x.shape
    width = weight.shape[1]
    if batch == 0:
        return out
    block_d, num_warps = config or launch_config(batch * dim)
    grid = (batch, triton.cdiv(dim, block_d))
    _causal_conv1d_update_kernel[grid](
        x,
        conv_state,
        weight,
        bias if bias is not None else weight,
        out,
        state_slots if state_slots is not None else x,
        null_slot,
        dim,
        x.stride(0),
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        WIDTH=width,
        HAS_BIAS=bias is not None,
        HAS_SLOTS=state_slots is not None,
        SILU=activation is not None,
        BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return out
