"""What the plugin cannot run goes to vLLM's built-in model instead of failing: installing the
plugin never refuses a config or engine feature vLLM accepts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.config_fakes import fake_vllm_config
from vllm_nemotron_h.model_executor.validation import (
    UnsupportedConfigError,
    align_for_plugin_states,
    deferred_writes_for_replayssm,
    deferred_writes_off_reason,
    hand_back_reason,
    state_layout,
)
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
    replayssm_buffer_len: int = 16,
    enable_prefix_caching: bool = False,
    mamba_cache_mode: str = "none",
    deferred_state_writes: int = 0,
    mamba_config: dict | None = None,
    **hf_changes,
) -> SimpleNamespace:
    hf = make_config(preset or TINY_PRESETS["dense"], TINY_VOCAB_SIZE, "float32")
    for field, value in hf_changes.items():
        setattr(hf, field, value)
    return fake_vllm_config(
        hf,
        spec_tokens=spec_tokens,
        spec_method=spec_method if spec_tokens else None,
        additional_config={
            "nemotron_h": {"ssm_state": ssm_state}
            | ({"deferred_state_writes": deferred_state_writes} if deferred_state_writes else {})
        },
        mamba_cache_mode=mamba_cache_mode,
        enable_prefix_caching=enable_prefix_caching,
        use_replayssm=use_replayssm,
        replayssm_buffer_len=replayssm_buffer_len,
        mamba_config=mamba_config,
    )


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(spec_tokens=1, spec_method="eagle3"), "speculative_config.method='eagle3'"),
        (dict(spec_tokens=2, spec_method="medusa"), "speculative_config.method='medusa'"),
        (dict(use_replayssm=True), "use_replayssm=True"),
        (dict(mamba_hidden_act="gelu"), "mamba_hidden_act='gelu'"),
        (dict(mamba_head_dim=160), "mamba_head_dim=160"),
        (dict(enable_prefix_caching=True, mamba_cache_mode="all"), "mamba_cache_mode='all'"),
        (dict(mamba_config=dict(backend="flashinfer")), "mamba_backend='flashinfer'"),
        (
            dict(mamba_config=dict(backend="triton", enable_stochastic_rounding=True)),
            "enable_mamba_cache_stochastic_rounding=True",
        ),
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


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
def test_the_plugin_runs_in_place_of_vllms_default_backend(monkeypatch, cpu):
    """vLLM's default state-update backend ('triton', its CPU op on a CPU) and, on a CPU,
    'cpu' (the op the plugin's CPU decode runs as well) are the plugin's to run; 'cpu' on a
    GPU is vLLM's model's, as 'flashinfer' is everywhere."""
    from vllm_nemotron_h.model_executor import validation

    monkeypatch.setattr(validation, "on_cpu", lambda: cpu)
    for backend, plugin_runs in (("triton", True), ("cpu", cpu), ("flashinfer", False)):
        reason = hand_back_reason(vllm_config(mamba_config=dict(backend=backend)))
        assert (reason is None) == plugin_runs, (backend, reason)


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(mamba_backend="flashinfer"), "mamba_backend='flashinfer'"),
        (
            dict(enable_mamba_cache_stochastic_rounding=True, mamba_ssm_cache_dtype="float16"),
            "enable_mamba_cache_stochastic_rounding=True",
        ),
        (dict(mamba_backend="cpu"), None),
    ],
)
def test_engine_options_reach_the_hand_back(tiny_checkpoint, options, named):
    """The options as vLLM's engine arguments make them (its Mamba config's enum and flag)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=tiny_checkpoint("dense"), skip_tokenizer_init=True, max_model_len=256, **options
    )
    reason = hand_back_reason(args.create_engine_config())
    assert reason is None if named is None else reason.startswith(named), reason


@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
@pytest.mark.parametrize("ssm_state", ["auto", "int8"])
def test_published_configs_run_on_the_plugin(model, ssm_state):
    """The family's published configs (config only: no weights on CPU) are the plugin's to
    build, with every state format."""
    assert hand_back_reason(vllm_config(ssm_state, preset=REAL_SHAPES[model])) is None


@pytest.mark.parametrize("ssm_state", ["auto", "int8"])
@pytest.mark.parametrize("ring, expected", [(None, 16), (8, 8)])
def test_replayssm_becomes_the_plugins_deferred_writes(ssm_state, ring, expected):
    """vLLM's config update for the architecture turns ReplaySSM off and the plugin's ring on,
    as long as ReplaySSM's buffer unless the option sets one; the caller's dicts unchanged."""
    config = vllm_config(ssm_state, use_replayssm=True)
    if ring:
        config.additional_config["nemotron_h"]["deferred_state_writes"] = ring
    given = config.additional_config
    snapshot = {k: dict(v) for k, v in given.items()}
    deferred_writes_for_replayssm(config)
    assert config.cache_config.use_replayssm is False
    assert config.additional_config["nemotron_h"]["deferred_state_writes"] == expected
    assert given == snapshot
    assert hand_back_reason(config) is None
    assert state_layout(config).ring_size == expected


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(replayssm_buffer_len=12), "ReplaySSM runs: replayssm_buffer_len=12"),
        (dict(spec_tokens=2), "ReplaySSM runs: the plugin's deferred writes do not run here: sp"),
        (dict(mamba_head_dim=160), "mamba_head_dim=160"),
        (dict(mamba_config=dict(backend="flashinfer")), "mamba_backend='flashinfer'"),
    ],
)
def test_replayssm_stays_with_vllm_where_the_plugin_would_not_defer(changes, named):
    """Where the plugin's deferred writes would not run, ReplaySSM stays on and vLLM's model
    serves it, the reason named; with the plugin's int8 state that is an error."""
    config = vllm_config(use_replayssm=True, **changes)
    deferred_writes_for_replayssm(config)
    assert config.cache_config.use_replayssm is True
    assert "deferred_state_writes" not in config.additional_config["nemotron_h"]
    assert named in hand_back_reason(config)
    with pytest.raises(UnsupportedConfigError, match="'int8' needs the plugin's model"):
        hand_back_reason(vllm_config("int8", use_replayssm=True, **changes))


def test_replayssm_with_prefix_caching_runs_as_deferred_writes():
    """ReplaySSM with prefix caching (vLLM 0.32's default) runs as the plugin's deferred
    writes: the rings are part of the states the cache keeps."""
    config = vllm_config(use_replayssm=True, enable_prefix_caching=True)
    deferred_writes_for_replayssm(config)
    assert config.cache_config.use_replayssm is False
    assert hand_back_reason(config) is None


def test_vllm_keeps_mamba_cache_mode_all_for_the_plugins_class():
    """vLLM 0.26 keeps its default Mamba cache mode with prefix caching, 'all', only for a
    class its registry records as claiming it (else it turns 'all' into 'align', which
    refuses token budgets 'all' takes); the plugin then hands 'all' to vLLM's model."""
    from vllm.model_executor.models.registry import _ModelInfo

    from vllm_nemotron_h.model_executor.hybrid_model import NemotronHForCausalLM

    assert _ModelInfo.from_model_cls(NemotronHForCausalLM).supports_mamba_prefix_caching
    reason = hand_back_reason(vllm_config(enable_prefix_caching=True, mamba_cache_mode="all"))
    assert "mamba_cache_mode='align' runs the plugin" in reason


def test_deferred_writes_stay_off_where_vllms_model_serves():
    """A config handed back to vLLM's model gets vLLM's states: no rings beside them."""
    config = vllm_config(
        enable_prefix_caching=True, mamba_cache_mode="all", deferred_state_writes=4
    )
    assert hand_back_reason(config).startswith("mamba_cache_mode='all'")
    assert state_layout(config).ring_size == 0
    assert deferred_writes_off_reason(config).startswith("vLLM's built-in model serves")
    assert state_layout(vllm_config(deferred_state_writes=4)).ring_size == 4


@pytest.mark.parametrize(
    "ssm_state, ring, prefix_caching, asked, mode",
    [
        ("int8", 0, True, "none", "align"),
        ("auto", 8, True, "none", "align"),
        ("int8", 4, True, "none", "align"),
        ("auto", 0, True, "none", "none"),  # vLLM picks: 'all' on 0.26, 'align' on 0.32
        ("int8", 0, False, "none", "none"),
        ("int8", 0, True, "all", "all"),  # asked for: an error naming 'align' (above)
    ],
)
def test_prefix_caching_with_the_plugins_states_runs_align(
    ssm_state, ring, prefix_caching, asked, mode
):
    """The plugin's own states run only on its model, and so in 'align': with prefix
    caching, the plugin's config update asks for it before vLLM picks a mode."""
    config = vllm_config(
        ssm_state,
        enable_prefix_caching=prefix_caching,
        mamba_cache_mode=asked,
        deferred_state_writes=ring,
    )
    align_for_plugin_states(config)
    assert config.cache_config.mamba_cache_mode == mode
    if mode == "align":
        assert hand_back_reason(config) is None
        assert state_layout(config).ring_size == ring


def test_vllms_mode_stands_where_vllms_model_serves_anyway():
    """Where the plugin hands the model back for another reason, its own states do not run
    and the mode is vLLM's to pick ('all' on 0.26, whose token budgets 'align' refuses)."""
    config = vllm_config(enable_prefix_caching=True, deferred_state_writes=4, mamba_head_dim=160)
    align_for_plugin_states(config)
    assert config.cache_config.mamba_cache_mode == "none"
    assert hand_back_reason(config).startswith("mamba_head_dim=160")
