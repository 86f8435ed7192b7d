"""Tensor parallel with Ray on GPUs, the way users start it:
``tensor_parallel_size=2, distributed_executor_backend="ray"`` gives the greedy tokens of
TP=1 on a small fp32 checkpoint. Skipped without two GPUs and Ray (run on nvidia-h200-x2)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.engines import run_engine
from vllm_nemotron_h.testing.checkpoints import write_tiny_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray"),
]

PROMPTS = [[1, 17, 301, 44, 9, 250, 77, 12, 5, 98, 411, 3], [1, 400, 23], [1, 88, 91, 17]]


@pytest.mark.parametrize("preset", ["dense-h80", "dense-g1"])  # n_groups 4 and 1
def test_ray_tp2_equals_tp1(preset, tmp_path):
    ckpt = str(write_tiny_checkpoint(tmp_path / preset, preset))
    # eager: the test is about the split across ranks; e2e.py runs TP=2 with CUDA graphs
    engine = dict(
        dtype="float32", max_model_len=256, gpu_memory_utilization=0.3, enforce_eager=True
    )
    spec = dict(model=ckpt, prompts=PROMPTS, max_tokens=24)
    tp1 = run_engine(dict(spec, engine=engine))
    tp2 = run_engine(
        dict(
            spec,
            engine=dict(engine, tensor_parallel_size=2, distributed_executor_backend="ray"),
        )
    )
    assert tp2["model_class"] == tp1["model_class"]
    assert tp2["model_class"].startswith("vllm_nemotron_h.")
    assert tp2["tokens"] == tp1["tokens"]
