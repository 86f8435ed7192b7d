"""The speculative decode tail written as its formula, one sequence and one token at a
time, in fp64 on the CPU, with the roundings the production paths make (each token's state
stored in the state's format and read back, the conv output and y in the activation dtype):
the test oracle of the kernels and the CPU path; production never calls it."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, group_norm
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.rms_norm.reference import group_rms_norm_reference
from vllm_nemotron_h.ops.state_format import dequantize, quantize


def _conv_reference(layer: DecodeLayer, step: SpeculativeStep) -> torch.Tensor:
    """The conv outputs (silu), rounded to the activation dtype; rolls the conv states."""
    xbc, conv_state = step.xbc, layer.conv_state
    width = layer.conv_weight.shape[1]
    w = layer.conv_weight.detach().cpu().double()
    bias = layer.conv_bias.detach().cpu().double() if layer.conv_bias is not None else 0.0
    y = torch.zeros(xbc.shape, dtype=torch.float64)
    for r in range(step.rows):
        slot = int(step.state_slots[r, 0])
        if slot == layer.null_slot:
            continue
        start, end = int(step.query_start[r]), int(step.query_start[r + 1])
        offset = int(step.num_accepted[r]) - 1
        history = conv_state[slot, :, offset : offset + width - 1]
        # Every token as the state stores it, after the accepted window.
        tokens = xbc[start:end].T.to(conv_state.dtype)
        seq = torch.cat([history, tokens], dim=1)
        for t in range(end - start):
            # The width - 1 stored values before token t, then the token as it arrives.
            window = torch.cat(
                [seq[:, t : t + width - 1].cpu().double(), xbc[start + t, :, None].cpu().double()],
                dim=1,
            )
            y[start + t] = torch.nn.functional.silu((window * w).sum(1) + bias)
        conv_state[slot, :, : seq.shape[1] - 1] = seq[:, 1:]
    return y.to(xbc.dtype)


def _stored(s: torch.Tensor, state: torch.Tensor, scale: torch.Tensor | None):
    """(s as the state stores it, its scales or None)."""
    if scale is None:
        return s.to(state.dtype), None
    return quantize(s)


def mamba2_speculative_decode_reference(layer: DecodeLayer, step: SpeculativeStep) -> torch.Tensor:
    """Same effects as ``mamba2_speculative_decode`` (see interface.py); returns the output
    (``step.out`` when given)."""
    state, scale = layer.ssm_state, layer.ssm_scale
    _, nheads, head_dim, d_state = state.shape
    conv = _conv_reference(layer, step)
    x, B, C = (t.double() for t in split_xbc(conv, nheads, head_dim, d_state))
    heads_per_group = nheads // B.shape[1]
    group = torch.arange(nheads) // heads_per_group  # the group of each head
    A, D, dt_bias = (t.detach().cpu().double() for t in (layer.A, layer.D, layer.dt_bias))
    dts = step.dt.detach().cpu().double()
    zs = step.z.detach().cpu().double() if step.z is not None else None
    y = torch.zeros(x.shape, dtype=torch.float64)
    for r in range(step.rows):
        if int(step.state_slots[r, 0]) == layer.null_slot:
            continue
        start, end = int(step.query_start[r]), int(step.query_start[r + 1])
        src = int(step.state_slots[r, int(step.num_accepted[r]) - 1])
        stored = state[src].cpu(), None if scale is None else scale[src].cpu()
        for t in range(end - start):
            tok = start + t
            s = stored[0].double() if scale is None else dequantize(stored[0], stored[1].double())
            dt = torch.nn.functional.softplus(dts[tok] + dt_bias)  # (nheads,)
            s = (
                s * torch.exp(A * dt)[:, None, None]
                + (dt[:, None] * x[tok])[..., None] * B[tok, group][:, None, :]
            )
            stored = _stored(s, state, scale)
            dst = int(step.state_slots[r, t])
            if dst != layer.null_slot:
                state[dst] = stored[0].to(state.device)
                if scale is not None:
                    scale[dst] = stored[1].to(scale)
            y[tok] = (s * C[tok, group][:, None, :]).sum(-1) + D[:, None] * x[tok]
            if zs is not None:
                y[tok] *= torch.nn.functional.silu(zs[tok].view(nheads, head_dim))
    y = y.flatten(1).to(step.xbc.dtype)
    if layer.norm_weight is not None:
        y = group_rms_norm_reference(y, group_norm(layer, B.shape[1])).to(y.dtype)
    y = y.to(step.xbc.device)
    return y if step.out is None else step.out.copy_(y)
