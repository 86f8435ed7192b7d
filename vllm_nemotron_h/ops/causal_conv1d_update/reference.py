"""The causal conv1d update written as its formula, one sequence at a time, in fp64 on the
CPU (the test oracle; production never calls it)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep


def causal_conv1d_update_reference(step: ConvUpdateStep) -> torch.Tensor:
    """Same effects as ``causal_conv1d_update`` (see interface.py); returns the output
    (``step.out`` when given)."""
    x, conv_state = step.x, step.conv_state
    batch, dim = x.shape
    w = step.weight.detach().cpu().double()
    y = torch.zeros(batch, dim, dtype=torch.float64)
    for b in range(batch):
        slot = int(step.state_slots[b]) if step.state_slots is not None else b
        if slot == step.null_slot:
            continue
        # window[c] = [state taps..., the new value]; out = act(window . weight + bias)
        window = torch.cat([conv_state[slot].cpu().double(), x[b].cpu().double()[:, None]], 1)
        y[b] = (window * w).sum(1)
        if step.bias is not None:
            y[b] += step.bias.detach().cpu().double()
        if step.activation is not None:
            y[b] = torch.nn.functional.silu(y[b])
        conv_state[slot] = window[:, 1:].to(conv_state.dtype)
    out = step.out if step.out is not None else torch.empty_like(x)
    return out.copy_(y)
