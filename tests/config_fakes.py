"""A stand-in for vLLM's VllmConfig with the fields the plugin's config checks read
(vllm_boundary.config), for tests of those checks without an engine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def fake_vllm_config(
    hf_config: Any,
    *,
    tensor_parallel_size: int = 1,
    spec_tokens: int = 0,
    spec_method: str | None = None,
    additional_config: dict | None = None,
    mamba_config: dict | None = None,
    **cache_fields: Any,
) -> SimpleNamespace:
    """``hf_config`` as the model's config; ``cache_fields`` (``mamba_cache_mode`` 'none'
    unless given) as the cache config's; a speculative config where ``spec_method`` is
    given; ``mamba_config`` as vLLM's Mamba config where given (vLLM versions with one)."""
    mamba = {} if mamba_config is None else {"mamba_config": SimpleNamespace(**mamba_config)}
    return SimpleNamespace(
        **mamba,
        model_config=SimpleNamespace(hf_config=hf_config),
        parallel_config=SimpleNamespace(tensor_parallel_size=tensor_parallel_size),
        cache_config=SimpleNamespace(**{"mamba_cache_mode": "none", **cache_fields}),
        num_speculative_tokens=spec_tokens,
        speculative_config=None if spec_method is None else SimpleNamespace(method=spec_method),
        additional_config=additional_config or {},
    )
