"""The family's configs as published, with random weights at their real sizes on a GPU: the
plugin builds each model (no hand-back), loads it and generates. Config-only checks of the
same configs, both schemas, run on CPU (tests/test_published_configs.py). Nemotron 3 Nano
30B-A3B's shape carries the fields of the newer members here (latent MoE and MTP layers),
which the model serves without its MTP layers unless speculative decoding asks for them.
Skipped without a GPU; the 30B case needs ~64 GiB of GPU memory."""

from __future__ import annotations

import pytest
import torch

from tests.engines import run_engine
from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES, write_published_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PLUGIN_CLASS = "vllm_nemotron_h.model_executor.hybrid_model.NemotronHForCausalLM"
NEWER_MEMBER_FIELDS = dict(
    moe_latent_size=1024, num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E"
)
# Nemotron 3 Super (~120 B parameters) does not fit one GPU: its config is checked on CPU
# (tests/test_published_configs.py); its newer fields run here on the 30B's shape.
CASES = [
    *(
        (model, {})
        for model in sorted(REAL_SHAPES)
        if model not in ("nano-v3-30b", "nemotron-3-super")
    ),
    ("nano-v3-30b", NEWER_MEMBER_FIELDS),
]
PROMPTS = [[1, 17, 301, 44, 9, 250, 77, 12, 5, 98, 411, 3], [1, 400, 23]]
NEW = 8


@pytest.mark.parametrize("model, changes", CASES, ids=[m for m, _ in CASES])
def test_published_config_runs_on_the_plugin(model, changes, tmp_path):
    path = write_published_config(tmp_path / model, model, tokenizer=True, **changes)
    engine = dict(
        load_format="dummy",
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=2,
        # a fixed KV cache instead of memory profiling: other tests' engines may share the GPU
        kv_cache_memory_bytes=1 << 30,
        gpu_memory_utilization=0.95,
    )
    spec = dict(model=str(path), prompts=PROMPTS, max_tokens=NEW, engine=engine)
    result = run_engine(spec, timeout=1200)
    assert result["model_class"] == PLUGIN_CLASS
    vocab = 131072
    assert [len(t) for t in result["tokens"]] == [NEW] * len(PROMPTS)
    assert all(0 <= t < vocab for tokens in result["tokens"] for t in tokens)
