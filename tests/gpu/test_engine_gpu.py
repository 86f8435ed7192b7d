"""The plugin in vLLM on a GPU (vLLM 0.26 on the H100): reference tokens, the built-in model,
CUDA graphs, and which kernels one decode step runs. Skipped without a GPU."""

from __future__ import annotations

import json
import os
from statistics import mean

import pytest
import torch

from tests.engines import NGRAM, ROOT, SPECULATION_PROMPTS, prefix_cache_prompts, run_engine
from tests.reference import hf_greedy
from training.pycode_data import heldout_stream
from vllm_nemotron_h.testing.checkpoints import (
    write_echo_draft_model,
    write_fp8_checkpoint,
    write_tiny_checkpoint,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = [
    [1, 17, 301, 44, 9, 250, 77, 12, 5, 98, 411, 3],
    [1, 400, 23],
    [1],  # a one-token prompt
    [1, 88, 91, 17, 260, 33, 470, 12],
]
NEW = 32
# The first prompt ends early: with two sequences per step, the one-token prompt then joins a
# step in which the second decodes, one token each, which vLLM runs as a full decode graph.
MAX_TOKENS = [8, NEW, NEW, NEW]
# The device table's fused tail off: the three kernels at every batch size.
NO_FUSED_TAIL = {"mamba2_decode_fused_max_batch_heads": 0}
# A fixed KV cache size instead of memory profiling: the engines of several test processes can
# then share one GPU (profiling reads the device's free memory, which the others change).
ENGINE = dict(
    max_model_len=512,
    gpu_memory_utilization=0.1,
    kv_cache_memory_bytes=2 << 30,
    enable_chunked_prefill=True,
    max_num_batched_tokens=16,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "dense-h80", "dense-h80"))


@pytest.fixture(scope="module")
def reference(checkpoint):
    return hf_greedy(checkpoint, PROMPTS, NEW, device="cuda")


def agreement(runs: list[list[int]], reference: list[list[int]]) -> list[int]:
    """Per prompt, how many tokens equal the reference's before the first difference."""
    return [
        next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), len(t))
        for t, r in zip(runs, reference)
    ]


def eager_and_graphs(
    checkpoint: str,
    max_tokens: list[int] = MAX_TOKENS,
    max_num_seqs: int = 2,
    launch_tables: dict | None = None,
    **options,
) -> tuple[dict, dict]:
    """The plugin with ``options`` (additional_config nemotron_h), fp32: eager (with one decode
    step's kernels profiled) and with CUDA graphs (more requests than decode slots per graph
    at the default max_num_seqs), both in this process so that the steps are the same in
    every run. ``launch_tables`` replaces entries of the device's tables (e.g. the fused
    tail's limit)."""
    engine = dict(ENGINE, dtype="float32")
    if options:
        engine["additional_config"] = {"nemotron_h": options}
    if "deferred_state_writes" in options:
        engine["enable_prefix_caching"] = False
    spec = dict(model=checkpoint, prompts=PROMPTS, max_tokens=max_tokens)
    if launch_tables:
        spec["launch_tables"] = launch_tables
    eager = run_engine(
        dict(spec, engine=dict(engine, enforce_eager=True), profile=True),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    sizes = [n for n in (1, 2, 4) if n <= max_num_seqs]
    graph_engine = dict(
        engine, max_num_seqs=max_num_seqs, compilation_config={"cudagraph_capture_sizes": sizes}
    )
    graphs = run_engine(
        dict(spec, engine=graph_engine, compiles=True), VLLM_ENABLE_V1_MULTIPROCESSING="0"
    )
    assert eager["model_class"].startswith("vllm_nemotron_h.")
    assert graphs["model_class"].startswith("vllm_nemotron_h.")
    return eager, graphs


def test_fp32_eager_and_graphs_match_transformers_and_builtin(checkpoint, reference):
    eager, graphs = eager_and_graphs(checkpoint)
    spec = dict(
        model=checkpoint,
        prompts=PROMPTS,
        max_tokens=MAX_TOKENS,
        engine=dict(ENGINE, dtype="float32", enforce_eager=True),
    )
    builtin = run_engine(spec, VLLM_NEMOTRON_H_DISABLE="1")
    assert builtin["model_class"] == "vllm.model_executor.models.nemotron_h.NemotronHForCausalLM"
    # vLLM's Triton prefill kernels take fp32 dots in TF32, so on a GPU vLLM (built-in as well)
    # may leave transformers' path at a near-tie; the plugin must equal the built-in exactly
    # and transformers wherever the built-in does.
    assert eager["tokens"] == builtin["tokens"]
    assert graphs["tokens"] == eager["tokens"]
    # With CUDA graphs the plugin's kernels compile at engine start (the layer plans' warm
    # launches), none in a request: a compile there costs its time to first token.
    print("Triton kernels compiled in requests:", graphs["compiled_in_requests"])
    plugin_compiled = [k for k in graphs["compiled_in_requests"] if k.startswith("vllm_nemotron_h")]
    assert plugin_compiled == [], f"the plugin's kernels compiled in requests: {plugin_compiled}"
    agree = agreement(builtin["tokens"], reference)
    print("tokens equal to transformers before the first difference, per prompt:", agree)
    assert sum(a == n for a, n in zip(agree, MAX_TOKENS)) >= len(PROMPTS) - 1
    kernels = [row[0] for row in eager["profile"]]
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "decode-profile.json"), "w") as f:
            json.dump(eager["profile"], f, indent=1)
    # Decode steps: the fused Mamba tail (conv, state update, gated group norm); neither
    # vLLM's state update nor the separate tail kernels.
    assert any("_mamba2_decode_kernel" in k for k in kernels), f"no fused tail: {kernels}"
    for other in (
        "_selective_scan_update_kernel",
        "_selective_state_update_kernel",
        "_causal_conv1d_update_kernel",
    ):
        assert not any(other in k for k in kernels), f"{other} ran in a decode step"


def test_mamba_layers_sharing_a_cache_group_decode_alike_in_cuda_graphs(tmp_path):
    """With two attention layers vLLM puts two Mamba layers in each KV-cache group: the
    group's first layer in the forward copies the step's slots into the group's buffer, inside
    the CUDA graph, and the other reads them there. A graph that lacked the copy would replay
    the capture's slots as the batch changes."""
    ckpt = str(write_tiny_checkpoint(tmp_path / "dense-grouped", "dense-grouped"))
    eager, graphs = eager_and_graphs(ckpt)
    assert graphs["tokens"] == eager["tokens"]


def test_int8_state_eager_equals_cuda_graphs(checkpoint, reference):
    """The int8 SSM state (additional_config nemotron_h.ssm_state) decodes the same tokens in
    eager mode and with CUDA graphs, through the fused decode tail; how far it stays with
    transformers' fp32 tokens is printed."""
    eager, graphs = eager_and_graphs(checkpoint, ssm_state="int8")
    assert graphs["tokens"] == eager["tokens"]
    kernels = [row[0] for row in eager["profile"]]
    assert any("_mamba2_decode_kernel" in k for k in kernels), kernels
    agree = agreement(eager["tokens"], reference)
    print("int8: tokens equal to transformers' fp32 before the first difference:", agree)


def test_deferred_writes_eager_equals_cuda_graphs_and_transformers(checkpoint, reference):
    """Deferred state writes (a ring of 4, additional_config nemotron_h.deferred_state_writes;
    prefix caching off) on the GPU, at every batch size (the fused tail's limit set to 0): the
    deferred state update kernel runs in decode steps, CUDA graphs give the eager tokens, and
    these stay with transformers' as the per-step fp32 path does."""
    eager, graphs = eager_and_graphs(
        checkpoint, launch_tables=NO_FUSED_TAIL, deferred_state_writes=4
    )
    assert graphs["tokens"] == eager["tokens"]
    kernels = [row[0] for row in eager["profile"]]
    assert any("_deferred_state_update_kernel" in k for k in kernels), kernels
    assert not any("_selective_scan_update_kernel" in k for k in kernels), kernels
    agree = agreement(eager["tokens"], reference)
    print("deferred writes: tokens equal to transformers before the first difference:", agree)
    assert sum(a == n for a, n in zip(agree, MAX_TOKENS)) >= len(PROMPTS) - 1


def test_deferred_writes_switch_to_the_fused_tail_at_small_batches(checkpoint, reference):
    """With deferred writes the fused per-step tail runs where the device table fuses (here
    up to 2 sequences: 16 batch x heads) and the deferred update above. Sequences end one by
    one (4 -> 3 -> 2 -> 1 decode rows, rings part-filled when the third ends), so that the
    first fused step must find every ring written into its state first: the tokens stay
    with transformers', in eager mode and with CUDA graphs (4 decode slots per graph)."""
    max_tokens = [6, 11, 21, NEW]
    eager, graphs = eager_and_graphs(
        checkpoint, max_tokens, max_num_seqs=4,
        launch_tables={"mamba2_decode_fused_max_batch_heads": 16}, deferred_state_writes=4,
    )  # fmt: skip
    assert graphs["tokens"] == eager["tokens"]
    kernels = [row[0] for row in eager["profile"]]  # one sequence: the fused tail
    assert any("_mamba2_decode_kernel" in k for k in kernels), kernels
    agree = agreement(eager["tokens"], reference)
    print("deferred writes, switching paths: tokens equal to transformers' before:", agree)
    assert sum(a == n for a, n in zip(agree, max_tokens)) >= len(PROMPTS) - 1


def test_deferred_writes_switch_to_the_per_step_update_where_deferring_does_not_pay(
    checkpoint, reference
):
    """Where the device table says deferring does not pay for the state format (here up to 2
    sequences of the fp32 state: 16 batch x heads; the fused tail off), the per-step state
    update runs and the deferred one above. Sequences end one by one (4 -> 3 -> 2 -> 1 decode
    rows), so that the first per-step step must find every ring written into its state: the
    tokens stay with transformers', in eager mode and with CUDA graphs."""
    max_tokens = [6, 11, 21, NEW]
    tables = dict(NO_FUSED_TAIL, deferred_state_update_pays={"80,16,4": [[16, 0], [None, 1]]})
    eager, graphs = eager_and_graphs(
        checkpoint, max_tokens, max_num_seqs=4, launch_tables=tables, deferred_state_writes=4
    )
    assert graphs["tokens"] == eager["tokens"]
    kernels = [row[0] for row in eager["profile"]]  # one sequence: the per-step update
    assert any("_selective_state_update_kernel" in k for k in kernels), kernels
    assert not any("_deferred_state_update_kernel" in k for k in kernels), kernels
    agree = agreement(eager["tokens"], reference)
    print("deferred writes, per-step where deferring does not pay: equal before:", agree)
    assert sum(a == n for a, n in zip(agree, max_tokens)) >= len(PROMPTS) - 1


def test_deferred_writes_with_prefix_caching_stay_with_transformers(checkpoint):
    """Deferred writes (a ring of 4, the deferred update at every batch) with prefix caching
    (no mode given: the plugin's config update asks for 'align', the mode it runs its own
    states in, where vLLM 0.26 would pick 'all') and CUDA graphs: the runner's copies of a
    state into the next block carry its ring, a prefill flushes the rings it reads. After
    fillers that leave part-full rings, prompts each extending the one before hit the cached
    blocks and decode as transformers does (one near-tie allowed, as on the per-step path).
    vLLM 0.26 keeps a prompt's state at the block boundaries where its prefill chunks end:
    chunks of one block here."""
    fillers, prompts = prefix_cache_prompts()
    engine = dict(
        ENGINE,
        dtype="float32",
        max_num_seqs=4,
        enable_prefix_caching=True,
        block_size=64,
        max_num_batched_tokens=64,
        additional_config={"nemotron_h": {"deferred_state_writes": 4}},
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4]},
    )
    res = run_engine(
        dict(
            model=checkpoint,
            prompts=fillers,
            max_tokens=NEW,
            engine=engine,
            jobs=[[p] for p in prompts],
            launch_tables=NO_FUSED_TAIL,
        ),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    assert res["model_class"].startswith("vllm_nemotron_h.")
    reference = hf_greedy(checkpoint, fillers + prompts, NEW, device="cuda")
    agree = agreement(res["tokens"] + [job[0] for job in res["jobs"]], reference)
    hits = [job[0] for job in res["cached_tokens"][1:]]
    print("deferred writes + prefix caching: tokens equal to transformers' before:", agree)
    print("prompt tokens from the prefix cache:", hits)
    assert all(hits[1:]), hits  # each prompt after the first extends a cached one
    assert sum(a == NEW for a in agree) >= len(agree) - 1


def test_moe_fp32_matches_builtin_and_transformers(tmp_path):
    """The MoE layers (Nemotron 3 Nano's `E`) on a GPU: vLLM's FusedMoE inside the plugin's
    model, CUDA graphs: the tokens of the built-in in eager mode, and transformers' (as
    above). The built-in with CUDA graphs is printed, not compared: on vLLM 0.26 it leaves
    transformers at the first token of every prompt of this preset (in eager mode it gives
    the plugin's tokens)."""
    ckpt = str(write_tiny_checkpoint(tmp_path / "moe", "moe"))
    engine = dict(ENGINE, dtype="float32")
    spec = dict(model=ckpt, prompts=PROMPTS, max_tokens=NEW)
    graphs = dict(engine, compilation_config={"cudagraph_capture_sizes": [1, 4]})
    ours = run_engine(dict(spec, engine=graphs))
    eager = dict(engine, enforce_eager=True)
    builtin = run_engine(dict(spec, engine=eager), VLLM_NEMOTRON_H_DISABLE="1")
    builtin_graphs = run_engine(dict(spec, engine=graphs), VLLM_NEMOTRON_H_DISABLE="1")
    reference = hf_greedy(ckpt, PROMPTS, NEW, device="cuda")
    agree = agreement(ours["tokens"], reference)
    # printed before any assert: a failure then says which model left transformers
    print("MoE: tokens equal to transformers before the first difference, per prompt:", agree)
    print("MoE, vLLM's model in eager mode:", agreement(builtin["tokens"], reference))
    print("MoE, vLLM's model with CUDA graphs:", agreement(builtin_graphs["tokens"], reference))
    assert ours["model_class"].startswith("vllm_nemotron_h.")
    assert ours["tokens"] == builtin["tokens"]
    assert sum(a == NEW for a in agree) >= len(PROMPTS) - 1


def logprob_diffs(a: dict, b: dict) -> list[float]:
    """|logprob difference| of the tokens two runs both generated, up to their first split."""
    diffs = []
    for t_a, t_b, l_a, l_b in zip(a["tokens"], b["tokens"], a["logprobs"], b["logprobs"]):
        for x, y, lx, ly in zip(t_a, t_b, l_a, l_b):
            if x != y:
                break
            diffs.append(abs(lx - ly))
    return diffs


def test_bf16_logprobs_as_accurate_as_builtin(tmp_path):
    """bf16 logprobs of the plugin and the built-in, each against an fp32 run on the same
    weights. On this random checkpoint each implementation's own bf16 error is larger than
    the difference between the two could be made (benchmarks/NOTES.md has the figures), so
    the difference is reported, and what is asserted is that the plugin's bf16 is as accurate
    as the built-in's (within 10 %)."""
    # Stored in bf16 like real Nemotron-H checkpoints: both implementations read the same
    # D and dt_bias values (the plugin keeps them in fp32, vLLM in the model dtype).
    ckpt = str(write_tiny_checkpoint(tmp_path / "dense-h80-bf16", "dense-h80", dtype="bfloat16"))
    spec = dict(
        model=ckpt,
        prompts=PROMPTS,
        max_tokens=NEW,
        logprobs=True,
        engine=dict(ENGINE, dtype="bfloat16", enforce_eager=True),
    )
    ours = run_engine(spec)
    builtin = run_engine(spec, VLLM_NEMOTRON_H_DISABLE="1")
    fp32 = run_engine(dict(spec, engine=dict(spec["engine"], dtype="float32")))
    between = logprob_diffs(ours, builtin)
    to_fp32 = {
        name: mean(logprob_diffs(run, fp32))
        for name, run in (("plugin", ours), ("builtin", builtin))
    }
    figures = dict(plugin_vs_builtin=mean(between), tokens=len(between), to_fp32=to_fp32)
    print(f"bf16 mean |logprob difference|: {figures}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bf16-logprob-diff.json"), "w") as f:
            json.dump(figures, f)
    assert len(between) >= 32
    assert to_fp32["plugin"] <= 1.1 * to_fp32["builtin"]


@pytest.mark.parametrize("weights", ["online", "checkpoint"])
def test_fp8_weights_as_accurate_as_builtin(tmp_path, weights):
    """FP8 weights on the shipped trained model: vLLM's online quantization
    (quantization="fp8") or a compressed-tensors FP8 checkpoint made from it (one scale per
    output channel, activations per token). The plugin serves them (vLLM's FP8 linear and MoE
    layers around the plugin's Mamba kernels); its greedy tokens and logprobs are compared
    with the built-in's on the same weights, and its FP8 error against its own bf16 run is
    no larger than the built-in's against the built-in's bf16 run (within 10 %)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from accuracy import greedy_prompts

    shipped = ROOT / "models" / "nemotron-h-pycode"
    engine = dict(ENGINE, dtype="bfloat16", enforce_eager=True)
    spec = dict(model=str(shipped), prompts=greedy_prompts(shipped, 8), max_tokens=NEW)
    spec["logprobs"] = True
    if weights == "online":
        fp8 = dict(spec, engine=dict(engine, quantization="fp8"))
    else:
        # The Mamba in_proj stays bf16: its 1,804 rows are no multiple of 16, and vLLM 0.26's
        # CUTLASS FP8 layer, padding such a weight at load, fails (in its own model too).
        fp8_dir = write_fp8_checkpoint(shipped, tmp_path / "fp8", keep=("in_proj",))
        fp8 = dict(spec, model=str(fp8_dir), engine=engine)
    runs = {
        ("plugin", "fp8"): run_engine(fp8),
        ("builtin", "fp8"): run_engine(fp8, VLLM_NEMOTRON_H_DISABLE="1"),
        ("plugin", "bf16"): run_engine(dict(spec, engine=engine)),
        ("builtin", "bf16"): run_engine(dict(spec, engine=engine), VLLM_NEMOTRON_H_DISABLE="1"),
    }
    assert runs["plugin", "fp8"]["model_class"].startswith("vllm_nemotron_h.")
    assert runs["builtin", "fp8"]["model_class"].startswith("vllm.model_executor.models.")
    between = logprob_diffs(runs["plugin", "fp8"], runs["builtin", "fp8"])
    to_bf16 = {
        impl: mean(logprob_diffs(runs[impl, "fp8"], runs[impl, "bf16"]))
        for impl in ("plugin", "builtin")
    }
    figures = dict(
        weights=weights,
        tokens_equal_to_builtin=agreement(
            runs["plugin", "fp8"]["tokens"], runs["builtin", "fp8"]["tokens"]
        ),
        logprob_diff_to_builtin=mean(between),
        fp8_logprob_diff_to_own_bf16=to_bf16,
        tokens_equal_to_own_bf16={
            impl: agreement(runs[impl, "fp8"]["tokens"], runs[impl, "bf16"]["tokens"])
            for impl in ("plugin", "builtin")
        },
    )
    print(f"FP8 weights: {figures}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"fp8-{weights}.json"), "w") as f:
            json.dump(figures, f)
    assert to_bf16["plugin"] <= 1.1 * to_bf16["builtin"] + 1e-3


@pytest.mark.parametrize("ssm_state", ["auto", "int8"])
def test_ngram_speculation_on_the_plugin(tmp_path, ssm_state):
    """vLLM's ngram speculation (3 draft tokens) verified by the plugin's speculative tail on
    the tiny "dense" checkpoint with the CPU test's prompts: CUDA graphs of 1 to 4 rows, prompt
    chunks of a 16-token budget beside rows that verify drafts, slots reused (15 requests, 4
    at a time). The plugin's greedy tokens without speculation, drafts accepted. With vLLM's
    state format, vLLM's own model runs the same: its tokens and acceptance are reported
    (vLLM 0.26 gives the accepted counts only to steps with drafts, and its model reads each
    row's first slot in the others). With the int8 state the speculative tail and the
    one-token tail round each state alike only up to the GPU's FMA contraction (a value on
    a quantization boundary may round the other way: tests/kernels), so on this random model
    a sequence may part from plain decoding at a near-tie; a wrong slot or count parts most
    sequences within their first tokens. Figures written to $OUT when set."""
    ckpt = str(write_tiny_checkpoint(tmp_path / "dense", "dense"))
    engine = dict(
        ENGINE,
        dtype="float32",
        max_num_seqs=4,
        disable_log_stats=False,
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 12, 16]},
        additional_config={"nemotron_h": {"ssm_state": ssm_state}},
    )
    spec = dict(model=ckpt, prompts=SPECULATION_PROMPTS, max_tokens=NEW, metrics=True)
    drafted = run_engine(dict(spec, engine=dict(engine, speculative_config=NGRAM)))
    plain = run_engine(dict(spec, engine=engine))
    assert drafted["model_class"].startswith("vllm_nemotron_h.")
    metrics = drafted["metrics"]
    figures = dict(
        ssm_state=ssm_state,
        draft_tokens=metrics.get("vllm:spec_decode_num_draft_tokens", 0),
        accepted=metrics.get("vllm:spec_decode_num_accepted_tokens", 0),
        equal_to_plain=agreement(drafted["tokens"], plain["tokens"]),
    )
    if ssm_state == "auto":
        builtin = run_engine(
            dict(spec, engine=dict(engine, speculative_config=NGRAM)), VLLM_NEMOTRON_H_DISABLE="1"
        )
        assert builtin["model_class"].startswith("vllm.model_executor.models.")
        figures["builtin_equal_to_plain"] = agreement(builtin["tokens"], plain["tokens"])
        figures["builtin_accepted"] = builtin["metrics"].get(
            "vllm:spec_decode_num_accepted_tokens", 0
        )
    print(f"ngram speculation: {figures}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"ngram-{ssm_state}.json"), "w") as f:
            json.dump(figures, f)
    assert 0 < figures["accepted"] < figures["draft_tokens"]
    if ssm_state != "int8":
        assert drafted["tokens"] == plain["tokens"]
        return
    equal = figures["equal_to_plain"]
    assert sum(n == NEW for n in equal) >= 3 * len(equal) // 4, equal
    assert min(equal) >= 8, equal


def test_prefix_caching_mode_all_goes_to_vllm_and_align_runs_the_plugin():
    """On the shipped model with prefix caching: vLLM 0.26's default Mamba cache mode for
    Nemotron-H, 'all', goes to vLLM's model, which serves it with bf16 weights and 256 tokens
    a step, a budget 'align' refuses there (a block then holds one Mamba state in attention
    pages: 448 tokens; 'all' rounds that up to the scan's chunks, 512 tokens, so the prompts
    fill a block); 'align', asked for, runs the plugin (fp32: blocks of 256 tokens), where a
    prompt extending a cached one, and the cached prompt again, decode as runs without
    prefix caching do (prompts prefilled in chunks that end at the cached block boundary)."""
    model = ROOT / "models" / "nemotron-h-pycode"
    stream = heldout_stream(model)
    base, longer = stream[:600], stream[:680]
    engine = dict(ENGINE, max_model_len=1024, block_size=64, max_num_batched_tokens=256)
    spec = dict(model=str(model), max_tokens=32, prompts=[base], jobs=[[longer], [base]])
    cached = dict(engine, enable_prefix_caching=True)
    vllms = run_engine(dict(spec, engine=dict(cached, dtype="bfloat16", mamba_cache_mode="all")))
    assert vllms["model_class"].startswith("vllm.model_executor."), vllms["model_class"]
    print("vLLM's model, mode 'all', cached prompt tokens per job:", vllms["cached_tokens"][1:])
    assert all(job[0] > 0 for job in vllms["cached_tokens"][1:]), vllms["cached_tokens"]

    hits = run_engine(dict(spec, engine=dict(cached, dtype="float32", mamba_cache_mode="align")))
    cold = run_engine(
        dict(spec, prompts=[longer], jobs=[[base]],
             engine=dict(engine, dtype="float32", enable_prefix_caching=False))
    )  # fmt: skip
    assert hits["model_class"].startswith("vllm_nemotron_h.")
    print("the plugin, mode 'align', cached prompt tokens per job:", hits["cached_tokens"][1:])
    assert all(job[0] > 0 for job in hits["cached_tokens"][1:]), hits["cached_tokens"]
    assert hits["jobs"][0][0] == cold["tokens"][0], "after a prefix-cache hit"
    assert hits["jobs"][1][0] == cold["jobs"][0][0] == hits["tokens"][0], "a full hit"


@pytest.mark.parametrize("method", ["mtp", "draft_model"])
def test_model_drafts_verified_by_the_plugin(tmp_path, method):
    """Drafts of a model verified by the plugin's speculative tail with CUDA graphs: the
    checkpoint's MTP layer (vLLM's nemotron_h_mtp, fed the plugin's hidden states; the
    "dense-mtp" preset's layer mostly drafts the token it is given), or a draft model (a
    Llama that mostly echoes its token, its keys and values in its own KV-cache group's
    blocks: vllm_boundary.draft_model), so drafts are accepted and rejected. 15 requests, 4
    at a time (slots reused), prompts prefilled beside rows that verify drafts, among them a
    prompt of 1 + drafts tokens (a decode row's shape, which vLLM's graph dispatch would
    replay as a decode): the plugin's greedy tokens without speculation. Figures written to
    $OUT when set."""
    preset = "dense-mtp" if method == "mtp" else "dense"
    ckpt = str(write_tiny_checkpoint(tmp_path / preset, preset))
    speculative = dict(method=method, num_speculative_tokens=2)
    if method == "draft_model":
        speculative["model"] = str(write_echo_draft_model(tmp_path / "draft"))
    engine = dict(
        ENGINE,
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=256,
        disable_log_stats=False,
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 12]},
    )
    spec = dict(model=ckpt, prompts=SPECULATION_PROMPTS, max_tokens=NEW, metrics=True)
    drafted = run_engine(dict(spec, engine=dict(engine, speculative_config=speculative)))
    plain = run_engine(dict(spec, engine=engine))
    assert drafted["model_class"].startswith("vllm_nemotron_h.")
    metrics = drafted["metrics"]
    figures = dict(
        draft_tokens=metrics.get("vllm:spec_decode_num_draft_tokens", 0),
        accepted=metrics.get("vllm:spec_decode_num_accepted_tokens", 0),
        equal_to_plain=agreement(drafted["tokens"], plain["tokens"]),
    )
    print(f"{method} speculation: {figures}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"speculation-{method}.json"), "w") as f:
            json.dump(figures, f)
    assert drafted["tokens"] == plain["tokens"]
    assert 0 < figures["accepted"] < figures["draft_tokens"]
