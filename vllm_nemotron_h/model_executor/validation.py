"""Checks at model load: unsupported configs fail with the field name and allowed values."""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig

from vllm_nemotron_h.compat import replayssm_enabled

LAYER_TYPES = {"M": "Mamba2", "*": "attention", "-": "MLP", "E": "MoE"}
HEAD_DIMS = (32, 128)
STATE_SIZES = (16, 256)
CONV_WIDTHS = (2, 4)


class UnsupportedConfigError(ValueError):
    """A config field or engine option vllm-nemotron-h does not support."""


def _fail(field: str, value: Any, allowed: str) -> None:
    raise UnsupportedConfigError(
        f"vllm-nemotron-h: unsupported {field}={value!r}; supported: {allowed}. "
        "Set VLLM_NEMOTRON_H_DISABLE=1 to run vLLM's built-in Nemotron-H instead."
    )


def validate(vllm_config: VllmConfig) -> None:
    config = vllm_config.model_config.hf_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    pattern = config.hybrid_override_pattern
    bad = sorted(set(pattern) - set(LAYER_TYPES))
    if bad:
        _fail(
            "hybrid_override_pattern",
            pattern,
            "characters " + ", ".join(f"{k!r} ({v})" for k, v in LAYER_TYPES.items()),
        )
    if "M" in pattern:
        heads, groups = config.mamba_num_heads, config.n_groups
        if groups <= 0 or heads % groups:
            _fail("n_groups", groups, f"a divisor of mamba_num_heads={heads}")
        if not HEAD_DIMS[0] <= config.mamba_head_dim <= HEAD_DIMS[1]:
            _fail("mamba_head_dim", config.mamba_head_dim, "{}..{}".format(*HEAD_DIMS))
        if not STATE_SIZES[0] <= config.ssm_state_size <= STATE_SIZES[1]:
            _fail("ssm_state_size", config.ssm_state_size, "{}..{}".format(*STATE_SIZES))
        if not CONV_WIDTHS[0] <= config.conv_kernel <= CONV_WIDTHS[1]:
            _fail("conv_kernel", config.conv_kernel, "{}..{}".format(*CONV_WIDTHS))
        if config.mamba_hidden_act not in ("silu", "swish"):
            _fail("mamba_hidden_act", config.mamba_hidden_act, "'silu' (the conv activation)")
        if heads % tp:
            _fail("mamba_num_heads", heads, f"a multiple of tensor_parallel_size={tp}")
        if groups % tp and groups != 1:
            _fail("n_groups", groups, f"1 or a multiple of tensor_parallel_size={tp}")
    cache = vllm_config.cache_config
    if cache.mamba_cache_mode not in ("none", "align"):
        _fail("mamba_cache_mode", cache.mamba_cache_mode, "'none' or 'align'")
    if vllm_config.num_speculative_tokens:
        _fail("num_speculative_tokens", vllm_config.num_speculative_tokens, "0")
    if replayssm_enabled(vllm_config):
        _fail("use_replayssm", True, "False")
