"""One decode step's arguments of the causal conv1d update, as one record: the public
function builds it, and the kernel launch, the CPU path and the reference take it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ConvUpdateStep:
    """Shapes and dtypes: interface.py's module doc."""

    x: torch.Tensor
    conv_state: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    activation: str | None = "silu"
    state_slots: torch.Tensor | None = None
    null_slot: int = -1
    out: torch.Tensor | None = None
