"""vLLM's Mamba2 attention backend, its metadata and builder: the per-step view of which
sequence owns which state slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backends.mamba2_attn import (
    Mamba2AttentionBackend,
    Mamba2AttentionMetadata,
    Mamba2AttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID  # 0 in both: vLLM's null block

__all__ = [
    "NULL_BLOCK_ID",
    "PlaceholderPrefills",
    "Mamba2AttentionBackend",
    "Mamba2AttentionMetadata",
    "Mamba2MetadataBuilder",
    "decode_slots",
    "first_tokens_as_decodes",
    "max_num_seqs",
]


class Mamba2MetadataBuilder(Mamba2AttentionMetadataBuilder):
    """vLLM's Mamba2 metadata builder with one hook, ``complete(metadata)``, run on every
    metadata vLLM hands to the layers: the one it builds, and the copies it makes for other
    KV-cache groups of the same spec with their own block table (``update_block_table``).

    A prompt of one token (or a first prompt chunk of one token) runs as a decode row from a
    zeroed slot: vLLM dispatches its CUDA graphs by shape, so a step whose rows all have one
    token replays the decode graph even when one row is a prompt's first token, which vLLM's
    metadata calls a prefill (the graph would then read the row's slot through a stale
    index). Under speculative decoding vLLM 0.32 schedules such a prompt's token with
    placeholder drafts (a row of 1 + drafts tokens, to keep its decode graph uniform): that
    row too runs as a decode, whose state after each token is kept and rolled back by the
    next step's accepted count, where a prefill would keep the state after the
    placeholders. The metadata's ``first_token_rows_d`` (the metadata class declares it)
    names those decode rows; ``complete`` must zero their slots (and, under speculative
    decoding, count one accepted token for them) before the step runs. Such a row that the
    split leaves among the prefills (a prefill of a few tokens before it) stays a prefill;
    ``placeholder_prefills`` names it, and the prefill must then keep the state after the
    prompt token alone.

    vLLM 0.26 passes the accepted counts (``num_accepted_tokens``) only to steps in which some
    row verifies drafts; ``query_start_rows`` (every row's first token, set here) lets
    ``complete`` count them itself for the other steps (vLLM 0.32 passes them every step)."""

    def complete(self, metadata: Mamba2AttentionMetadata) -> Mamba2AttentionMetadata:
        return metadata

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        **kwargs: Any,
    ) -> Mamba2AttentionMetadata:
        common_attn_metadata, first_token = first_tokens_as_decodes(
            common_attn_metadata, kwargs.get("num_decode_draft_tokens_cpu")
        )
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        metadata.placeholder_prefills = None
        if first_token is not None:  # rows past the decode rows stay prefills (no state read)
            metadata.placeholder_prefills = PlaceholderPrefills.of(
                common_attn_metadata, first_token[first_token >= metadata.num_decodes], metadata
            )
            first_token = first_token[first_token < metadata.num_decodes]
        metadata.first_token_rows_d = first_token
        # every row's first token (vLLM's runner buffer, on the device): the builder follows
        # each sequence's progress from it under speculative decoding
        metadata.query_start_rows = common_attn_metadata.query_start_loc
        return self.complete(metadata)

    def update_block_table(
        self, metadata: Mamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> Mamba2AttentionMetadata:
        return self.complete(super().update_block_table(metadata, blk_table, slot_mapping))


@dataclass
class PlaceholderPrefills:
    """Prefill rows made of a prompt's one token and vLLM 0.32's placeholder drafts (rows the
    split left behind a prefill, so they could not run as decodes): the prefill must keep
    the state after the prompt token alone. Indices relative to the step's prefill rows and
    tokens, on the metadata's device."""

    rows: torch.Tensor  # the rows among the prefill rows
    tokens: torch.Tensor  # each row's prompt token
    placeholders: torch.Tensor  # every placeholder token of the rows

    @classmethod
    def of(cls, common_attn_metadata: Any, rows: torch.Tensor, metadata: Any):
        """Those of ``rows`` (batch rows, CPU) that hold placeholders, or None."""
        starts = common_attn_metadata.query_start_loc_cpu
        lens = starts[rows + 1] - starts[rows]
        rows = rows[lens > 1]
        if not len(rows):
            return None
        first = starts[rows] - metadata.num_decode_tokens
        placeholders = torch.cat(
            [torch.arange(int(f) + 1, int(f) + int(n)) for f, n in zip(first, lens[lens > 1])]
        )
        device = metadata.state_indices_tensor_p.device
        return cls(
            (rows - metadata.num_decodes).to(device), first.to(device), placeholders.to(device)
        )


def first_tokens_as_decodes(
    common_attn_metadata: Any, draft_tokens: torch.Tensor | None = None
) -> tuple[Any, torch.Tensor | None]:
    """``common_attn_metadata`` with rows that are a prompt's first and only scheduled token
    (with placeholder drafts where ``draft_tokens``, vLLM 0.32's per-row draft counts of
    decode transactions, -1 elsewhere, say so) no longer marked prefilling (vLLM's split then
    counts them as decodes: its reordering puts rows of up to 1 + drafts tokens before
    longer ones), and the indices of those rows (CPU int64), or None."""
    is_prefilling = common_attn_metadata.is_prefilling  # CPU, as vLLM's split reads it
    seq_lens = common_attn_metadata.seq_lens_cpu_upper_bound
    # a step of decodes alone (most steps) pays one op here: this runs on the host every step
    if is_prefilling is None or seq_lens is None or not bool(is_prefilling.any()):
        return common_attn_metadata, None
    query_lens = torch.diff(common_attn_metadata.query_start_loc_cpu)
    one_token = query_lens == 1
    if draft_tokens is not None:
        drafts = draft_tokens[: len(query_lens)]
        one_token |= (drafts >= 0) & (query_lens == drafts + 1)
    first_token = is_prefilling & one_token & (seq_lens == query_lens)
    if not bool(first_token.any()):
        return common_attn_metadata, None
    rows = first_token.nonzero().flatten()
    return common_attn_metadata.replace(is_prefilling=is_prefilling & ~first_token), rows


def decode_slots(metadata: Mamba2AttentionMetadata) -> torch.Tensor:
    """The decode rows' state slots (int32, the first block of each row's block table)."""
    return metadata.state_indices_tensor_d[:, 0]


def max_num_seqs(vllm_config: Any) -> int:
    return vllm_config.scheduler_config.max_num_seqs
