"""What the plugin cannot run goes to vLLM's built-in model instead of failing: installing the
plugin never refuses a config or engine feature vLLM accepts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_nemotron_h.model_executor.validation import UnsupportedConfigError, hand_back_reason
from vllm_nemotron_h.testing.checkpoints import (
    REAL_SHAPES,
    TINY_PRESETS,
    TINY_VOCAB_SIZE,
    make_config,
)


def vllm_config(
    ssm_state: str = "auto",
    spec_tokens: int = 0,
    spec_method: str = "ngram",
    use_replayssm: bool = False,
    preset: dict | None = None,
    **hf_changes,
) -> SimpleNamespace:
    hf = make_config(preset or TINY_PRESETS["dense"], TINY_VOCAB_SIZE, "float32")
    for field, value in hf_changes.items():
        setattr(hf, field, value)
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        cache_config=SimpleNamespace(mamba_cache_mode="none", use_replayssm=use_replayssm),
        num_speculative_tokens=spec_tokens,
        speculative_config=SimpleNamespace(method=spec_method) if spec_tokens else None,
        additional_config={"nemotron_h": {"ssm_state": ssm_state}},
    )


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(spec_tokens=1, spec_method="eagle3"), "speculative_config.method='eagle3'"),
        (dict(spec_tokens=2, spec_method="draft_model"), "speculative_config.method='draft_mo"),
        (dict(use_replayssm=True), "use_replayssm=True"),
        (dict(mamba_hidden_act="gelu"), "mamba_hidden_act='gelu'"),
        (dict(mamba_head_dim=160), "mamba_head_dim=160"),
    ],
)
def test_reason_names_the_field(changes, named):
    assert hand_back_reason(vllm_config()) is None
    assert hand_back_reason(vllm_config(**changes)).startswith(named)
    with pytest.raises(UnsupportedConfigError, match=f"'int8' needs the plugin's model.*{named}"):
        hand_back_reason(vllm_config("int8", **changes))


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu", "suffix", "mtp"])
@pytest.mark.parametrize("ssm_state", ["auto", "int8"])
def test_speculation_runs_on_the_plugin(method, ssm_state):
    """Drafts proposed from the tokens alone or by the checkpoint's MTP layers are verified
    by the plugin's model (tests/test_speculative_decoding.py, tests/gpu/test_engine_gpu.py
    run them)."""
    assert hand_back_reason(vllm_config(ssm_state, spec_tokens=3, spec_method=method)) is None


@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
@pytest.mark.parametrize("ssm_state", ["auto", "int8"])
def test_published_configs_run_on_the_plugin(model, ssm_state):
    """The family's published configs (config only: no weights on CPU) are the plugin's to
    build, with every state format."""
    assert hand_back_reason(vllm_config(ssm_state, preset=REAL_SHAPES[model])) is None
