"""The causal conv1d update written as its formula, one sequence at a time, in fp64 on the
CPU (the test oracle; production never calls it)."""

from __future__ import annotations

import torch


def causal_conv1d_update_reference(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and effects as ``causal_conv1d_update`` (see interface.py)."""
    batch, dim = x.shape
    w = weight.detach().cpu().double()
    y = torch.zeros(batch, dim, dtype=torch.float64)
    for b in range(batch):
        slot = int(state_slots[b]) if state_slots is not None else b
        if slot == null_slot:
            continue
        # window[c] = [state taps..., the new value]; out = act(window . weight + bias)
        window = torch.cat([conv_state[slot].cpu().double(), x[b].cpu().double()[:, None]], 1)
        y[b] = (window * w).sum(1)
        if bias is not None:
            y[b] += bias.detach().cpu().double()
        if activation is not None:
            y[b] = torch.nn.functional.silu(y[b])
        conv_state[slot] = window[:, 1:].to(conv_state.dtype)
    if out is None:
        out = torch.empty_like(x)
    return out.copy_(y)
