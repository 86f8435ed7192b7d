"""State cache manager: one int64 state-slot tensor per step, shared by every Mamba layer.

vLLM allocates each Mamba layer's conv and SSM state tensors and gives every running
sequence a slot (the first block of its block table, int32). The builder below turns the
decode rows' slots into an int64 tensor written into a buffer allocated once at start: its
address never changes, so CUDA graphs replay it, and the kernels index the state with it
directly (no per-layer casts). Padded rows hold vLLM's null block, which kernels skip.
All Mamba layers of a KV-cache group share one builder, hence one tensor per step, and one
``DecodeWorkspace`` (the fused decode kernel's arrival counters and partial sums), allocated
with the slot buffer and handed to the layers through the metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backends.mamba2_attn import (
    Mamba2AttentionBackend,
    Mamba2AttentionMetadata,
    Mamba2AttentionMetadataBuilder,
)

from vllm_nemotron_h.compat import NULL_BLOCK_ID
from vllm_nemotron_h.kernels import DecodeWorkspace


@dataclass
class StateSlotsMetadata(Mamba2AttentionMetadata):
    # int64 slots of the decode rows (a view of the builder's persistent buffer).
    state_slots_d: torch.Tensor | None = None
    decode_workspace: DecodeWorkspace | None = None


class StateSlotsMetadataBuilder(Mamba2AttentionMetadataBuilder):
    metadata_cls = StateSlotsMetadata

    def __init__(
        self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        max_rows = vllm_config.scheduler_config.max_num_seqs
        self.state_slots = torch.full((max_rows,), NULL_BLOCK_ID, dtype=torch.int64, device=device)
        nheads, head_dim, _ = kv_cache_spec.shapes[1]  # the SSM state of one slot
        self.decode_workspace = DecodeWorkspace.allocate(max_rows, nheads, head_dim, device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        **kwargs: Any,
    ) -> StateSlotsMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        return self._with_state_slots(metadata)

    def update_block_table(
        self, metadata: StateSlotsMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> StateSlotsMetadata:
        # vLLM reuses one group's metadata for other groups of the same spec and swaps in
        # their block table: their slots differ, so they are rewritten here too.
        metadata = super().update_block_table(metadata, blk_table, slot_mapping)
        return self._with_state_slots(metadata)

    def _with_state_slots(self, metadata: StateSlotsMetadata) -> StateSlotsMetadata:
        metadata.state_slots_d = None
        metadata.decode_workspace = self.decode_workspace
        if metadata.num_decodes > 0:
            slots = metadata.state_indices_tensor_d[:, 0]
            rows = slots.shape[0]
            self.state_slots[:rows].copy_(slots, non_blocking=True)
            metadata.state_slots_d = self.state_slots[:rows]
        return metadata


class StateSlotsMamba2Backend(Mamba2AttentionBackend):
    @staticmethod
    def get_builder_cls() -> type[StateSlotsMetadataBuilder]:
        return StateSlotsMetadataBuilder
