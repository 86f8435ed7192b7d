"""Checks at model load: unsupported configs fail with the field name and allowed values."""

from __future__ import annotations

from typing import Any

from vllm_nemotron_h.ops.support import CONV_WIDTH_RANGE, D_STATE_RANGE, HEAD_DIM_RANGE
from vllm_nemotron_h.vllm_boundary.config import (
    VllmConfig,
    mamba_cache_mode,
    replayssm_enabled,
    speculative_tokens,
)

LAYER_TYPES = {"M": "Mamba2", "*": "attention", "-": "MLP", "E": "MoE"}


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
        for field, bounds in (
            ("mamba_head_dim", HEAD_DIM_RANGE),
            ("ssm_state_size", D_STATE_RANGE),
            ("conv_kernel", CONV_WIDTH_RANGE),
        ):
            value = getattr(config, field)
            if not bounds[0] <= value <= bounds[1]:
                _fail(field, value, "{}..{}".format(*bounds))
        if config.mamba_hidden_act not in ("silu", "swish"):
            _fail("mamba_hidden_act", config.mamba_hidden_act, "'silu' (the conv activation)")
        if heads % tp:
            _fail("mamba_num_heads", heads, f"a multiple of tensor_parallel_size={tp}")
        if groups % tp and groups != 1:
            _fail("n_groups", groups, f"1 or a multiple of tensor_parallel_size={tp}")
    if mamba_cache_mode(vllm_config) not in ("none", "align"):
        _fail("mamba_cache_mode", mamba_cache_mode(vllm_config), "'none' or 'align'")
    if speculative_tokens(vllm_config):
        _fail("num_speculative_tokens", speculative_tokens(vllm_config), "0")
    if replayssm_enabled(vllm_config):
        _fail("use_replayssm", True, "False")
