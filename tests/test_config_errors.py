"""Configs the plugin cannot run fail at load, naming the field and the supported values."""

from __future__ import annotations

import pytest

from tests.conftest import with_config
from tests.engines import run_engine_expect_failure

pytestmark = pytest.mark.engine


def test_n_groups_not_dividing_heads_is_refused(tiny_checkpoint, tmp_path):
    bad = with_config(tiny_checkpoint("dense"), tmp_path / "bad", n_groups=3)  # 8 heads
    err = run_engine_expect_failure(
        dict(
            model=bad,
            prompts=[[1, 2]],
            max_tokens=2,
            engine=dict(dtype="float32", max_model_len=256, gpu_memory_utilization=0.1),
        )
    )
    assert "unsupported n_groups=3; supported: a divisor of mamba_num_heads=8" in err


def test_conv_activation_other_than_silu_is_refused():
    """The decode kernel applies silu after the conv; checked without an engine."""
    from types import SimpleNamespace

    from vllm_nemotron_h.model_executor.validation import UnsupportedConfigError, validate
    from vllm_nemotron_h.testing.checkpoints import TINY_PRESETS, TINY_VOCAB_SIZE, make_config

    hf = make_config(TINY_PRESETS["dense"], TINY_VOCAB_SIZE, "float32")
    hf.mamba_hidden_act = "gelu"
    config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        cache_config=SimpleNamespace(mamba_cache_mode="none"),
        num_speculative_tokens=0,
    )
    with pytest.raises(UnsupportedConfigError, match="unsupported mamba_hidden_act='gelu'"):
        validate(config)
