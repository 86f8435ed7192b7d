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
]


class Mamba2MetadataBuilder(Mamba2AttentionMetadataBuilder):
    """vLLM's Mamba2 metadata builder with one hook, ``complete(metadata)``, run on every
    metadata vLLM hands to the layers: the one it builds, and the copies it makes for other
    KV-cache groups of the same spec with their own block table (``update_block_table``)."""

    def complete(self, metadata: Mamba2AttentionMetadata) -> Mamba2AttentionMetadata:
        return metadata

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        **kwargs: Any,
    ) -> Mamba2AttentionMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        return self.complete(metadata)

    def update_block_table(
        self, metadata: Mamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> Mamba2AttentionMetadata:
        return self.complete(super().update_block_table(metadata, blk_table, slot_mapping))


def decode_slots(metadata: Mamba2AttentionMetadata) -> torch.Tensor:
    """The decode rows' state slots (int32, the first block of each row's block table)."""
    return metadata.state_indices_tensor_d[:, 0]


def max_num_seqs(vllm_config: Any) -> int:
    return vllm_config.scheduler_config.max_num_seqs
