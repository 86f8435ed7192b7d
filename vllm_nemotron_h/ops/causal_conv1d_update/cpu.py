"""The CPU serving path of the causal conv1d update: the batch's windows in one tensor."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep


def causal_conv1d_update_cpu(step: ConvUpdateStep) -> torch.Tensor:
    """Same effects as the interface's ``causal_conv1d_update`` (``step.out`` given); no
    checks."""
    x, conv_state, weight, bias, out = step.x, step.conv_state, step.weight, step.bias, step.out
    batch = x.shape[0]
    slots = step.state_slots
    if slots is None:
        slots = torch.arange(batch, device=x.device)
    live = slots != step.null_slot
    idx = slots[live]
    window = torch.cat([conv_state[idx], x[live, :, None].to(conv_state.dtype)], dim=-1)
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    if step.activation is not None:
        y = torch.nn.functional.silu(y)
    conv_state[idx] = window[..., 1:]
    out.zero_()
    out[live] = y.to(out.dtype)
    return out
