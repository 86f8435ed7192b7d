"""The prefill tail's state arguments as one record: the public function builds it, the
launch, the CPU path and the reference take it beside the rows they normalise."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class FinalStates:
    """``values[i]`` (the scan's final state of prefill row i: the state's dtype, fp32 for an
    int8 state) goes into slot ``slots[i]`` of ``ssm_state``; ``ssm_scale``: an int8 state's
    per-row scales, else None."""

    ssm_state: torch.Tensor
    ssm_scale: torch.Tensor | None
    slots: torch.Tensor
    values: torch.Tensor
