"""One decode step's arguments of a Mamba2 layer's state update, as one record: the public
function builds it once, and the kernel launch, the CPU path and the reference take it (the
state update with deferred writes takes the same record beside its own state)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StateUpdateStep:
    """Shapes and dtypes: interface.py's module doc."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    z: torch.Tensor | None = None
    state_slots: torch.Tensor | None = None
    null_slot: int = -1
    out: torch.Tensor | None = None
