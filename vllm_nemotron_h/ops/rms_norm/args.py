"""The grouped RMSNorm's parameters as one record: a layer keeps it, and the launch, the CPU
path and the reference take it beside the rows they normalise."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class GroupNorm:
    """``weight`` (hidden,), normalising each contiguous group of ``group_size`` channels."""

    weight: torch.Tensor
    group_size: int
    eps: float = 1e-5
