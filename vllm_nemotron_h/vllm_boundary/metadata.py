"""vLLM's Mamba2 attention backend, its metadata and builder: the per-step view of which
sequence owns which state slot."""

from __future__ import annotations

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
    index). The metadata's ``first_token_rows_d`` (the metadata class declares it) names
    those decode rows; ``complete`` must zero their slots before the step runs."""

    def complete(self, metadata: Mamba2AttentionMetadata) -> Mamba2AttentionMetadata:
        return metadata

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        **kwargs: Any,
    ) -> Mamba2AttentionMetadata:
        common_attn_metadata, first_token = first_tokens_as_decodes(common_attn_metadata)
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        if first_token is not None:  # rows past the decode rows stay prefills (no state read)
            first_token = first_token[first_token < metadata.num_decodes]
        metadata.first_token_rows_d = first_token
        return self.complete(metadata)

    def update_block_table(
        self, metadata: Mamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> Mamba2AttentionMetadata:
        return self.complete(super().update_block_table(metadata, blk_table, slot_mapping))


def first_tokens_as_decodes(common_attn_metadata: Any) -> tuple[Any, torch.Tensor | None]:
    """``common_attn_metadata`` with rows that are a prompt's first and only scheduled token
    no longer marked prefilling (vLLM's split then counts them as decodes: its reordering puts
    one-token rows before longer ones), and the indices of those rows (CPU int64), or None."""
    is_prefilling = common_attn_metadata.is_prefilling  # CPU, as vLLM's split reads it
    seq_lens = common_attn_metadata.seq_lens_cpu_upper_bound
    if is_prefilling is None or seq_lens is None:
        return common_attn_metadata, None
    query_lens = torch.diff(common_attn_metadata.query_start_loc_cpu)
    first_token = is_prefilling & (query_lens == 1) & (seq_lens == 1)
    if not bool(first_token.any()):
        return common_attn_metadata, None
    rows = first_token.nonzero().flatten()
    return common_attn_metadata.replace(is_prefilling=is_prefilling & ~first_token), rows


def decode_slots(metadata: Mamba2AttentionMetadata) -> torch.Tensor:
    """The decode rows' state slots (int32, the first block of each row's block table)."""
    return metadata.state_indices_tensor_d[:, 0]


def max_num_seqs(vllm_config: Any) -> int:
    return vllm_config.scheduler_config.max_num_seqs
