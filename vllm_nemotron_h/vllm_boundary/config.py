"""The engine options the plugin reads from vLLM's config, across the tested versions."""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig, get_current_vllm_config

__all__ = [
    "VllmConfig",
    "additional_config",
    "current_vllm_config",
    "mamba_cache_mode",
    "replayssm_enabled",
    "speculative_method",
    "speculative_tokens",
    "ssm_state_dtype",
    "tensor_parallel_size_of",
]


def replayssm_enabled(vllm_config: VllmConfig) -> bool:
    """``--use-replayssm`` (vLLM >= 0.27; 0.26 has no such option)."""
    return bool(getattr(vllm_config.cache_config, "use_replayssm", False))


def mamba_cache_mode(vllm_config: VllmConfig) -> str:
    """'none', 'align' or 'all': how prefix caching keeps Mamba states."""
    return vllm_config.cache_config.mamba_cache_mode


def speculative_tokens(vllm_config: VllmConfig) -> int:
    return vllm_config.num_speculative_tokens or 0


def speculative_method(vllm_config: VllmConfig) -> str | None:
    """``speculative_config.method`` ('ngram', 'draft_model', 'mtp', ...), or None."""
    speculative = getattr(vllm_config, "speculative_config", None)
    return getattr(speculative, "method", None) if speculative is not None else None


def ssm_state_dtype(vllm_config: VllmConfig) -> str:
    """The SSM state's dtype: ``mamba_ssm_cache_dtype``, "auto" meaning the model's dtype."""
    dtype = vllm_config.cache_config.mamba_ssm_cache_dtype
    if dtype == "auto":
        dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
    return dtype


def tensor_parallel_size_of(vllm_config: VllmConfig) -> int:
    return vllm_config.parallel_config.tensor_parallel_size


def additional_config(vllm_config: VllmConfig) -> dict[str, Any]:
    """``--additional-config`` / ``LLM(additional_config=...)``: a dict (empty when unset)."""
    return vllm_config.additional_config or {}


def current_vllm_config() -> VllmConfig:
    """The config of the model being built (vLLM sets it around model construction): the
    mixer's constructor is not handed the whole config."""
    return get_current_vllm_config()
