"""The CPU serving path of the causal conv1d update: the batch's windows in one tensor."""

from __future__ import annotations

import torch


def causal_conv1d_update_cpu(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    state_slots: torch.Tensor | None,
    null_slot: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """Same arguments and effects as the interface's ``causal_conv1d_update`` (``out``
    given); no checks."""
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
    out.zero_()
    out[live] = y.to(out.dtype)
    return out
