"""The CPU serving path of the speculative decode tail: the live sequences at once, one
token position at a time (a step has at most one target and a few draft tokens)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, group_norm
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.state_format import dequantize, quantize


def _conv(layer: DecodeLayer, step: SpeculativeStep, rows, starts, lens, accepted) -> torch.Tensor:
    """The conv outputs of the live rows' tokens (silu; zero elsewhere); rolls their states."""
    xbc, conv_state = step.xbc, layer.conv_state
    width = layer.conv_weight.shape[1]
    slots = step.state_slots[rows, 0]
    states = conv_state[slots]  # (n, dim, width - 1 + K - 1)
    taps = (accepted - 1)[:, None, None] + torch.arange(width - 1, device=xbc.device)
    window = states.gather(2, taps.expand(-1, states.shape[1], -1))  # the accepted window
    states[..., : width - 2] = window[..., 1:]
    weight = layer.conv_weight.float()
    bias = layer.conv_bias.float() if layer.conv_bias is not None else 0.0
    conv = torch.zeros_like(xbc)
    for t in range(step.max_tokens):
        has = lens > t
        if not bool(has.any()):
            break
        tok = (starts + t)[has]
        x_t = xbc[tok]
        taps = torch.cat([window[has].float(), x_t[..., None].float()], dim=-1)
        conv[tok] = torch.nn.functional.silu((taps * weight).sum(-1) + bias).to(conv.dtype)
        x_t = x_t.to(conv_state.dtype)
        states[has, :, width - 2 + t] = x_t
        window[has] = torch.cat([window[has][..., 1:], x_t[..., None]], dim=-1)
    conv_state[slots] = states
    return conv


def mamba2_speculative_decode_cpu(layer: DecodeLayer, step: SpeculativeStep) -> torch.Tensor:
    """Same effects as the interface's ``mamba2_speculative_decode`` (``step.out`` given);
    no checks."""
    out, query_start = step.out, step.query_start
    state, scale = layer.ssm_state, layer.ssm_scale
    _, nheads, head_dim, d_state = state.shape
    rows = (step.state_slots[:, 0] != layer.null_slot).nonzero().flatten()
    starts = query_start[rows]
    lens = query_start[rows + 1] - starts
    accepted = step.num_accepted[rows]
    conv = _conv(layer, step, rows, starts, lens, accepted)
    x, B, C = split_xbc(conv, nheads, head_dim, d_state)
    heads_per_group = nheads // B.shape[1]
    z = step.z.view(x.shape)
    src = step.state_slots[rows, accepted - 1]
    s = state[src]  # each row's state as stored, then after each of its tokens
    s_scale = scale[src] if scale is not None else None
    y = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(step.max_tokens):
        has = lens > t
        if not bool(has.any()):
            break
        tok = (starts + t)[has]
        old = s[has].float() if scale is None else dequantize(s[has], s_scale[has])
        dt = torch.nn.functional.softplus(step.dt[tok].float() + layer.dt_bias)  # (m, nheads)
        Bh = B[tok].float().repeat_interleave(heads_per_group, dim=1)  # (m, nheads, d_state)
        Ch = C[tok].float().repeat_interleave(heads_per_group, dim=1)
        x_t = x[tok].float()
        new = old * torch.exp(layer.A * dt)[..., None, None] + (
            (dt[..., None] * x_t)[..., None] * Bh[:, :, None, :]
        )
        dst = step.state_slots[rows[has], t]
        kept = dst != layer.null_slot
        if scale is None:
            s[has] = stored = new.to(state.dtype)
            state[dst[kept]] = stored[kept]
        else:
            stored, stored_scale = quantize(new)
            s[has], s_scale[has] = stored, stored_scale
            state[dst[kept]], scale[dst[kept]] = stored[kept], stored_scale[kept]
        y_t = (new * Ch[:, :, None, :]).sum(-1) + layer.D[:, None] * x_t
        y[tok] = y_t * torch.nn.functional.silu(z[tok].float())
    rows_tokens = slice(int(query_start[0]), int(query_start[-1]))  # y is 0 for null rows
    out[rows_tokens] = y[rows_tokens].flatten(1).to(out.dtype)
    if layer.norm_weight is not None:
        group_rms_norm_cpu(out, group_norm(layer, B.shape[1]), out=out)
    return out
