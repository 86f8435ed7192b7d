"""When each tensor-parallel rank runs each engine step, without the profiler: vLLM's built-in
Nemotron-H against the plugin, each in its own process, engines alternating over --rounds.

In every worker (vLLM's collective_rpc) the model runner's execute_model is wrapped for one
generate(max_tokens=1 + --decode-steps) of --batch prompts: per call, the host clock
(CLOCK_MONOTONIC, one clock for every process of the host) at entry and at return, and on a
GPU the device time between CUDA events recorded at entry and at return, and the step's
scheduled tokens and the CUDA-graph mode vLLM's dispatcher chose for its forward (FULL: one
graph, the host builds metadata and launches it; PIECEWISE: the attention and Mamba ops run
eagerly between graphs; NONE: eager), which the summaries split by, and the host time of
the runner's phases in the step (RUNNER_PHASES: input preparation, metadata building, the
forward's launch...), of each attention metadata builder class's builds (the plugin's
Mamba builder against vLLM's) and of the Mamba layers' ops within the forward, then the host
time of the runner's sample_tokens (its own call after execute_model) and how long the
worker then waits for the next step (the engine core's scheduling and output handling):
where one implementation's host time goes, and whether it lies in the worker at all. The
ranks run the same steps in the same order, so step i of every rank is one engine step: a
rank's lateness is its entry less the earliest rank's; the step's interval is one entry to
the next. A rank that enters late makes the others wait in the step's all-reduces (their
device time grows), which is what a profile's all-reduce kernels show without saying which
rank or why. The first call (the prefill) is summarised apart (its host time by phase: a
lone prompt's time to first token), the others as decode steps. Where each rank's process
runs: its CPU affinity and its parent's (the engine core's, under the multiprocessing
executor), and the CPU each step entered on (a late rank's process may share a core with
another's busy loop).

    python benchmarks/rank_step_times.py --model nemotron-h-8b --tensor-parallel-size 4
    VLLM_CPU_OMP_THREADS_BIND="0|1" python benchmarks/rank_step_times.py --model dense \\
        --tensor-parallel-size 2 --decode-steps 8     # on CPU
    python benchmarks/rank_step_times.py --model dense --tensor-parallel-size 1 \\
        --engine-processes    # on CPU, the engine core and worker apart as LLM() runs them

Writes benchmarks/results/ (or --output-dir)
rank-step-times-<model>-<state dtype>-b<batch>-tp<N>[-processes]-<device>.json.gz (gzip) and
its .png.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gzip
import json
import os
import statistics
import time
from pathlib import Path

# benchmarks/ is this script's directory
from child_process import answer_child, run_impl
from e2e import RESULTS, build_llm, device_tag, random_prompts

from vllm_nemotron_h.model_executor.decode_plan import integer_runs

# Runner methods timed inside each step where the installed vLLM has them, and every attention
# metadata builder's build: where a step's host time goes, without the profiler.
RUNNER_PHASES = (
    "_update_states",
    "_prepare_inputs",
    "_determine_batch_execution_and_padding",
    "_get_slot_mappings",
    "_build_attention_metadata",
    "_preprocess",
    "_model_forward",
)
# The runner's sample_tokens (its own call after execute_model), kept with the step's phases
# but outside execute_model's host time.
SAMPLING = "sample_tokens (after execute_model)"
# The Mamba layers' conv_ssm_forward calls of a step, summed (inside _model_forward).
MIXER_OPS = "mixer ops"


def start_timer(worker) -> None:
    """In each worker: wraps its model runner's execute_model to record each call, the
    dispatcher's choice of CUDA-graph mode, and the host time of the runner's phases and of
    each metadata builder class within the call."""
    import torch

    runner = worker.model_runner
    records: list = []
    restores: list = []
    cuda = torch.cuda.is_available()
    modes: list[str] = []
    phases: dict[str, float] = {}

    def wrap(owner, name: str, make):
        # restored as found: the instance's own attribute put back, or the class's uncovered
        own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        restores.append(lambda: setattr(owner, name, original) if own else delattr(owner, name))

    def timing(key: str, phases_of=lambda: phases):
        # adds the call's host us to the dict phases_of() returns (None: not timed)
        def make(original):
            def timed_phase(*args, **kwargs):
                t = time.perf_counter_ns()
                try:
                    return original(*args, **kwargs)
                finally:
                    into = phases_of()
                    if into is not None:
                        into[key] = into.get(key, 0.0) + (time.perf_counter_ns() - t) / 1e3

            return timed_phase

        return make

    for name in RUNNER_PHASES:
        if hasattr(runner, name):
            wrap(runner, name, timing(name))
    wrap(runner.model, "compute_logits", timing("compute_logits"))
    for groups in getattr(runner, "attn_groups", []):
        for group in groups:
            for builder in getattr(group, "metadata_builders", []):
                wrap(builder, "build", timing(f"build {type(builder).__name__}"))
    # each Mamba layer's op (what runs eagerly between the forward's graphs), summed per step
    for module in runner.model.modules():
        if hasattr(type(module), "conv_ssm_forward"):
            wrap(module, "conv_ssm_forward", timing(f"{MIXER_OPS} {type(module).__name__}"))

    def recording_mode(original):
        def dispatch(*args, **kwargs):
            result = original(*args, **kwargs)
            modes.append(getattr(result[0], "name", str(result[0])))
            return result

        return dispatch

    if getattr(runner, "cudagraph_dispatcher", None) is not None:
        wrap(runner.cudagraph_dispatcher, "dispatch", recording_mode)

    sched_getcpu = ctypes.CDLL(None).sched_getcpu  # glibc: ~1 us a call

    def recording_step(original):
        def timed(*args, **kwargs):
            enter = time.monotonic_ns()
            cpu = sched_getcpu()
            tokens = getattr(args[0], "total_num_scheduled_tokens", None) if args else None
            first_mode = len(modes)
            phases.clear()
            start = torch.cuda.Event(enable_timing=True) if cuda else None
            if start is not None:
                start.record()
            try:
                return original(*args, **kwargs)
            finally:
                end = torch.cuda.Event(enable_timing=True) if cuda else None
                if end is not None:
                    end.record()
                mode = modes[-1] if len(modes) > first_mode else None
                step_phases = {k: round(v, 1) for k, v in phases.items()}
                leave = time.monotonic_ns()
                records.append((enter, leave, start, end, tokens, mode, step_phases, cpu))

        return timed

    wrap(runner, "execute_model", recording_step)
    if hasattr(runner, "sample_tokens"):
        # the runner samples in a call of its own after execute_model (vLLM >= 0.11): its
        # host time joins the last step's phases, outside execute_model's window
        wrap(runner, "sample_tokens", timing(SAMPLING, lambda: records[-1][6] if records else None))
    worker.nemotron_h_step_times = records, restores


def stop_timer(worker) -> list[tuple]:
    """In each worker: restores what start_timer wrapped; per call (entry ns, return ns,
    device us, scheduled tokens, CUDA-graph mode, host us by phase, CPU at entry)."""
    import torch

    records, restores = worker.nemotron_h_step_times
    for restore in reversed(restores):
        restore()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return [
        (enter, leave, None if start is None else 1e3 * start.elapsed_time(end), *rest)
        for enter, leave, start, end, *rest in records
    ]


def placement(worker) -> dict:
    """In each worker: the CPUs its process and its parent (the engine core under the
    multiprocessing executor; the driver under ``uni``) may run on."""
    parent = os.getppid()
    return dict(
        pid=os.getpid(),
        affinity=sorted(os.sched_getaffinity(0)),
        parent_pid=parent,
        parent_affinity=sorted(os.sched_getaffinity(parent)),
    )


def child(
    model: str, state_dtype: str, batch: int, decode_steps: int, tp: int, processes: bool = False
) -> dict:
    import torch
    from vllm import SamplingParams

    from vllm_nemotron_h.testing import model_class_name

    executor = "mp" if tp > 1 or processes else "uni"
    engine = dict(tensor_parallel_size=tp, distributed_executor_backend=executor)
    llm = build_llm(model, state_dtype, [batch], decode_steps + 1, **engine)
    prompts = random_prompts(llm, batch, torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.0, max_tokens=decode_steps + 1, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: compiles, autotunes, fills caches
    llm.collective_rpc(start_timer)
    llm.generate(prompts, params, use_tqdm=False)
    return dict(
        model_class=llm.apply_model(model_class_name)[0],
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        ranks=llm.collective_rpc(stop_timer),
        placement=llm.collective_rpc(placement),
    )


def summary(ranks: list[list[tuple]]) -> dict:
    """Per rank, over the decode steps (every call but the first): median and 90th-percentile
    lateness, the share of steps it entered last, median host and device time per call, and
    per CUDA-graph mode the steps and their medians; and the median step interval (rank 0's
    entries)."""
    steps = min(len(r) for r in ranks)
    enters = [[r[i][0] for r in ranks] for i in range(1, steps)]
    late = [[(e - min(step)) / 1e3 for e in step] for step in enters]
    last = [max(range(len(step)), key=step.__getitem__) for step in enters]

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    def times(calls: list[tuple]) -> dict:
        device = [c[2] for c in calls if c[2] is not None]
        return dict(
            host_us_median=med([(c[1] - c[0]) / 1e3 for c in calls]),
            device_us_median=med(device) if device else None,
        )

    def waiting(calls: list[tuple]) -> float | None:
        """Median time a decode step's worker waits for the next step (the engine core's
        scheduling and output handling, or the driver's): return to the next entry, less the
        step's sample_tokens host time."""
        waits = [
            (calls[i + 1][0] - calls[i][1]) / 1e3 - calls[i][5].get(SAMPLING, 0.0)
            for i in range(1, min(steps, len(calls) - 1))
        ]
        return med(waits) if waits else None

    def by_phase(calls: list[tuple]) -> dict:
        return dict(steps=len(calls), **times(calls), host_us_by_phase=host_by_phase(calls))

    per_rank = []
    for rank, calls in enumerate(ranks):
        decode = calls[1:steps]
        lateness = sorted(step[rank] for step in late)
        modes = sorted({str(c[4]) for c in decode})
        per_rank.append(
            dict(
                late_us_median=med(lateness),
                late_us_p90=round(lateness[int(0.9 * (len(lateness) - 1))], 1),
                last_share=round(last.count(rank) / len(last), 3),
                **times(decode),
                waiting_us_median=waiting(calls),
                by_mode={m: by_phase([c for c in decode if str(c[4]) == m]) for m in modes},
                # the CPUs its decode steps entered on, most used first: [cpu, steps]
                entry_cpus=collections.Counter(c[6] for c in decode).most_common(4),
                prefill=by_phase(calls[:1]),
            )
        )
    rank0 = [calls[0] for calls in ranks[0][1:steps]]
    return dict(
        decode_steps=steps - 1,
        step_interval_us_median=med([(b - a) / 1e3 for a, b in zip(rank0, rank0[1:])]),
        ranks=per_rank,
    )


def host_by_phase(calls: list[tuple]) -> dict[str, float]:
    """The median host us of each phase over ``calls`` (stop_timer's records), and "other":
    the step's host time outside the timed phases."""
    names = sorted({name for c in calls for name in c[5]})
    host = {name: round(statistics.median([c[5].get(name, 0.0) for c in calls]), 1)
            for name in names}  # fmt: skip
    other = [(c[1] - c[0]) / 1e3 - outer_phases_us(c[5]) for c in calls]
    host["other"] = round(statistics.median(other), 1)
    return host


def outer_phases_us(phases: dict[str, float]) -> float:
    """The host us of execute_model's phases that do not nest in one another (builds nest in
    _build_attention_metadata, the mixer ops in _model_forward; sampling follows
    execute_model)."""
    return sum(
        us
        for name, us in phases.items()
        if not name.startswith(("build ", MIXER_OPS)) and name != SAMPLING
    )


def print_table(res: dict[str, dict]) -> None:
    cols = (
        "late_us_median", "late_us_p90", "last_share", "host_us_median", "device_us_median",
        "waiting_us_median",
    )  # fmt: skip
    print(f"\n{'impl / round':18}{'rank':>5}" + "".join(f"{c:>18}" for c in cols))
    for name, r in res.items():
        s = r["summary"]
        for rank, row in enumerate(s["ranks"]):
            print(f"{name:18}{rank:>5}" + "".join(f"{str(row[c]):>18}" for c in cols))
            where = r["placement"][rank]
            print(
                f"{'':18}{'':>5}  entry CPUs [cpu, steps] {row['entry_cpus']}; affinity "
                f"{','.join(integer_runs(where['affinity']))}, parent's "
                f"{','.join(integer_runs(where['parent_affinity']))}"
            )
            groups = {"prefill": row["prefill"], **row["by_mode"]}
            for label, m in groups.items():
                print(
                    f"{'':18}{'':>5}  {label:>9}: {m['steps']} steps, host {m['host_us_median']}"
                    f" us, device {m['device_us_median']} us"
                )
                for phase, us in m["host_us_by_phase"].items():
                    print(f"{'':36}{phase:54}{us:>10} us")
        print(f"{'':18}step interval (median) {s['step_interval_us_median']} us")


def plot(res: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(res), 1, figsize=(9, 2.6 * len(res)), squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], res.items()):
        ranks = r["ranks"]
        steps = min(len(calls) for calls in ranks)
        first = [min(calls[i][0] for calls in ranks) for i in range(1, steps)]
        for rank, calls in enumerate(ranks):
            late = [(calls[i][0] - first[i - 1]) / 1e3 for i in range(1, steps)]
            ax.plot(late, label=f"rank {rank}", linewidth=0.9)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("entry after the first rank (us)", fontsize=8)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("decode step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if answer_child(child):
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-h-8b", help="a real shape or a tiny preset")
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--decode-steps", type=int, default=128)
    ap.add_argument("--tensor-parallel-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="engines per implementation")
    ap.add_argument("--impls", default="builtin,plugin")
    ap.add_argument(
        "--engine-processes",
        action="store_true",
        help="the engine core and the rank in processes of their own at TP=1 too, as LLM() "
        "and e2e.py run them (default: both in this script's child)",
    )
    ap.add_argument("--output-dir", type=Path, default=RESULTS)
    args = ap.parse_args()
    spec = dict(
        model=args.model, state_dtype=args.state_dtype, batch=args.batch,
        decode_steps=args.decode_steps, tp=args.tensor_parallel_size,
        processes=args.engine_processes,
    )  # fmt: skip
    impls = args.impls.split(",")
    res: dict[str, dict] = {}
    for round_ in range(args.rounds):
        # alternating which goes first: an engine's place in the job must not decide
        for impl in impls if round_ % 2 == 0 else impls[::-1]:
            r = run_impl(
                __file__, impl, spec,
                VLLM_ENABLE_V1_MULTIPROCESSING="1" if args.engine_processes else "0",
                VLLM_WORKER_MULTIPROC_METHOD="spawn",
            )  # fmt: skip
            r["summary"] = summary(r["ranks"])
            res[f"{impl} {round_}"] = r
    print_table(res)
    device = next(iter(res.values()))["device"]
    name = (
        f"rank-step-times-{args.model}-{args.state_dtype}-b{args.batch}"
        f"-tp{args.tensor_parallel_size}{'-processes' if args.engine_processes else ''}"
        f"-{device_tag(device)}"
    )
    meta = dict(
        vars(args), output_dir=str(args.output_dir), date=time.strftime("%Y-%m-%d"),
        device=device,
    )  # fmt: skip
    args.output_dir.mkdir(parents=True, exist_ok=True)
    # compressed: every step's times per rank make the file large (up to a megabyte)
    path = args.output_dir / f"{name}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(dict(meta=meta, **res), f, indent=1)
    plot(res, args.output_dir / f"{name}.png")
    print(f"wrote {path} and {name}.png")


if __name__ == "__main__":
    main()
