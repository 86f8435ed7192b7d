"""A speculative decode step's arguments as one record: the rows of one verification step
(each sequence's last accepted token and its draft tokens), beside the decode tail's layer
record (ops/mamba2_decode/args.py), which the public function, the kernels' launch, the CPU
path and the reference all take."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class SpeculativeStep:
    """Shapes and dtypes: interface.py's module doc."""

    xbc: torch.Tensor
    dt: torch.Tensor
    z: torch.Tensor | None  # None: y left ungated (the CPU paths; as DecodeStep.z)
    state_slots: torch.Tensor
    query_start: torch.Tensor
    num_accepted: torch.Tensor
    out: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.state_slots.shape[0]

    @property
    def max_tokens(self) -> int:
        """Tokens per row at most: the slots per row."""
        return self.state_slots.shape[1]
