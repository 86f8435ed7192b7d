"""The CPU serving paths of the state slot copies: PyTorch indexing."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.state_format import dequantize


def gather_state_slots_cpu(
    state: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and result as the interface's ``gather_state_slots``; no checks."""
    index = slots.long()
    rows = state[index] if scale is None else dequantize(state[index], scale[index])
    if has_initial is None:
        return rows
    return torch.where(has_initial.view(-1, *[1] * (state.dim() - 1)), rows, 0)


def scatter_state_slots_cpu(state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Same arguments and effect as the interface's ``scatter_state_slots``; no checks."""
    state[slots.long()] = values
