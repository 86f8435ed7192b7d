"""tensor_parallel_size=2 on CPU (multiprocessing executor) gives the tokens of TP=1."""

from __future__ import annotations

import pytest

from tests.conftest import with_config
from tests.engines import TINY_ENGINE, TP_ENV, run_engine, run_engine_expect_failure

pytestmark = pytest.mark.engine

PROMPTS = [[1, 40, 41, 300, 7, 9, 12], [1, 250], [1, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99]]


# n_groups 2 (split) and 1 (spans ranks); latent MoE (its projections replicated, experts split)
@pytest.mark.parametrize("preset", ["dense", "dense-g1", "moe-latent"])
def test_tp2_matches_tp1(tiny_checkpoint, preset):
    model = tiny_checkpoint(preset)
    spec = dict(model=model, prompts=PROMPTS, max_tokens=16, engine=TINY_ENGINE)
    tp1 = run_engine(spec)
    tp2 = run_engine(dict(spec, engine=dict(TINY_ENGINE, tensor_parallel_size=2)), **TP_ENV)
    assert tp2["model_class"].startswith("vllm_nemotron_h.")
    assert tp2["tokens"] == tp1["tokens"]


def test_tp_size_not_dividing_groups_gets_vllms_own_error(tiny_checkpoint, tmp_path):
    """The plugin hands the config to vLLM's model, which refuses it as it would without the
    plugin."""
    bad = with_config(tiny_checkpoint("dense"), tmp_path / "g3", mamba_num_heads=6, n_groups=3)
    err = run_engine_expect_failure(
        dict(
            model=bad,
            prompts=[[1, 2]],
            max_tokens=2,
            engine=dict(TINY_ENGINE, tensor_parallel_size=2),
        ),
        **TP_ENV,
    )
    assert "n_groups=3, the plugin runs 1 or a multiple of TP=2: vLLM's built-in" in err
    assert "If tensor parallel world size does not divide num_groups" in err
