"""The arguments of ops/speculative_rows as records: what vLLM's metadata gives for one KV-cache
group's step, the builder's buffers it fills, and the builder's record of each sequence's
progress (for counting accepted tokens where vLLM gives none)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StepRows:
    """vLLM's decode rows of one step: ``slot_table`` (rows, K) int32 or int64, any strides (a
    slot per token a row may verify); ``query_start`` (rows + 1,) the rows' first tokens and
    ``num_accepted`` (rows,) the tokens each accepted at its previous step, int32 or int64, or
    both None where vLLM gives none (a step of one token per row)."""

    slot_table: torch.Tensor
    query_start: torch.Tensor | None = None
    num_accepted: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.slot_table.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.slot_table.shape[1]


@dataclass(slots=True)
class RowBuffers:
    """The builder's int64 buffers, allocated once (stable addresses for CUDA graphs):
    ``state_slots`` (max_rows, K), ``query_start`` (max_rows + 1,), ``num_accepted``
    (max_rows,), each contiguous."""

    state_slots: torch.Tensor
    query_start: torch.Tensor
    num_accepted: torch.Tensor

    @property
    def max_rows(self) -> int:
        return self.state_slots.shape[0]


@dataclass(slots=True)
class AcceptedCount:
    """Every row of the step, decode rows first (vLLM's order): ``num_decodes`` of them
    decode, the rest prefill; ``prefill_slots`` (at least rows - num_decodes,) the prefill
    rows' slots, ``seq_lens`` (at least rows,) each row's tokens after this step,
    ``step_starts`` (at least rows + 1,) each row's first token among the step's (int32 or
    int64, any stride for the slots); ``tokens_before`` (num_slots,) int64 by slot: the
    tokens each slot's sequence had computed before its last step (its prefill's last token
    for a prefill), read and written."""

    tokens_before: torch.Tensor
    prefill_slots: torch.Tensor
    seq_lens: torch.Tensor
    step_starts: torch.Tensor
    num_decodes: int
    num_rows: int
