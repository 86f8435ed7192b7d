"""Configs the plugin cannot run fail at load, naming the field and the supported values."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.engines import run_engine_expect_failure

pytestmark = pytest.mark.engine


def test_n_groups_not_dividing_heads_is_refused(tiny_checkpoint, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint("dense"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["n_groups"] = 3  # 8 heads
    (bad / "config.json").write_text(json.dumps(cfg))
    err = run_engine_expect_failure(
        dict(
            model=str(bad),
            prompts=[[1, 2]],
            max_tokens=2,
            engine=dict(dtype="float32", max_model_len=256, gpu_memory_utilization=0.1),
        )
    )
    assert "unsupported n_groups=3; supported: a divisor of mamba_num_heads=8" in err
