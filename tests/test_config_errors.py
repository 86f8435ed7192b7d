"""Configs no Nemotron-H model can be, and bad plugin options, fail at load naming the field
and the allowed values (what only the plugin cannot run: test_hand_back.py)."""

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


def test_unknown_ssm_state_format_is_refused_at_load(tiny_checkpoint):
    err = run_engine_expect_failure(
        dict(
            model=tiny_checkpoint("dense"),
            prompts=[[1, 2]],
            max_tokens=2,
            engine=dict(
                dtype="float32",
                max_model_len=256,
                gpu_memory_utilization=0.1,
                additional_config={"nemotron_h": {"ssm_state": "fp8"}},
            ),
        )
    )
    assert "unsupported additional_config['nemotron_h']['ssm_state']='fp8'; allowed: 'auto'" in err
    assert "'int8'" in err


@pytest.mark.parametrize(
    "section, message",
    [
        ({"ssm_sate": "int8"}, r"unknown option additional_config\['nemotron_h'\]\['ssm_sate'\]"),
        (
            {"deferred_state_writes": 12},
            r"unsupported additional_config\['nemotron_h'\]\['deferred_state_writes'\]=12; "
            r"allowed: 0 \(off",
        ),
        ("int8", r"additional_config\['nemotron_h'\] must be a dict"),
    ],
)
def test_plugin_option_mistakes_are_named(section, message):
    from types import SimpleNamespace

    from vllm_nemotron_h.model_executor.validation import UnsupportedConfigError, plugin_options

    config = SimpleNamespace(additional_config={"nemotron_h": section})
    with pytest.raises(UnsupportedConfigError, match=message):
        plugin_options(config)
    defaults = {"ssm_state": "auto", "deferred_state_writes": 0}
    assert plugin_options(SimpleNamespace(additional_config={})) == defaults
