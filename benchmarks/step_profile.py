"""Where an engine step's time goes: device time per kernel (GPU; CPU time per op on CPU) of
one prefill step and of one decode step, vLLM's built-in Nemotron-H against the plugin, each
in its own process of one job.

Method: a torch profiler runs in every worker, started and stopped through vLLM's
collective_rpc (at TP=1 the worker and the engine are this process: the "uni" executor and
VLLM_ENABLE_V1_MULTIPROCESSING=0; with --tensor-parallel-size N each rank profiles itself).
After a warm-up the profilers record generate(max_tokens=1) (the prefill step and its first
token) and generate(max_tokens=1 + N); a kernel's time per decode step is (its time in the
long run - its time in the short run) / N. Rank 0's kernels make the tables; every rank's
kernel total is kept (*_kernel_us_by_rank). Wall times of the two runs give the step's wall
time the same way; wall minus kernel time is what the GPU waited for the host. Kernels are
summed into categories by name (CATEGORIES). The prefill step is also timed without the
profiler: generate(max_tokens=1) PREFILL_RUNS times (median and minimum), the time to first
token of a lone batch. With --host (always on CPU) the profiler also records CPU ops, and
the ops that took the most host time in each step are listed with their call counts (self
time: what the op's own Python and dispatch cost, not its children); on a GPU that makes a
run several times slower (8B at B=1: ~4 min per implementation).

    python benchmarks/step_profile.py --model nemotron-h-8b --state-dtype float32 --batches 1
    python benchmarks/step_profile.py --model nemotron-h-8b --state-dtype bfloat16 --host
    python benchmarks/step_profile.py --model dense --batches 4   # a tiny preset, on CPU too
    python benchmarks/step_profile.py --model nemotron-h-8b --batches 1,128 --tensor-parallel-size 2
    python benchmarks/step_profile.py --model nano-v3-30b --state-dtype bfloat16 --batches 1,128 \
        --moe-routing uniform_random   # both routed alike (see e2e.py)

Writes benchmarks/results/ (or --output-dir)
step-profile-<model>-<state dtype>-b<batch>[-tp<N>][-<routing>-routing]-<device>.json, one per
batch, each
batch profiled on the same engine (one per implementation).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

# benchmarks/ is this script's directory
from child_process import answer_child, run_impl
from e2e import (
    MOE_ROUTING_ENV,
    PROMPT_LEN,
    RESULTS,
    build_llm,
    check_moe_routing,
    device_tag,
    random_prompts,
)

# First match wins; names are CUDA kernel names (or aten op names on CPU).
CATEGORIES = [
    ("Mamba decode tail (fused: conv, state update, norm)", r"mamba2_decode"),
    (
        "Mamba state update",
        r"selective_state_update|selective_scan_update|speculative_state_update",
    ),
    ("Mamba conv", r"causal_conv1d|speculative_conv"),
    (
        "Mamba chunked scan (prefill)",
        r"chunk_scan|chunk_state|chunk_cumsum|bmm_chunk|state_passing",
    ),
    ("norms", r"rms_norm|rmsnorm|layer_norm|group_norm"),
    ("attention", r"attention|flash|fmha|attn"),
    # the experts' kernels and the routing around them (vLLM's fused MoE)
    ("MoE", r"moe|expert"),
    (
        "GEMM / GEMV",
        r"gemm|gemv|cutlass|xmma|nvjet|matmul|onednn_mm|aten::mm|aten::addmm|splitK",
    ),
    ("Inductor fused", r"^triton_"),
    ("copies", r"[Mm]emcpy|[Mm]emset|copy|aten::index"),
    ("sampling", r"topk|top_k|sampl|argmax|softmax|sort"),
]


def category(name: str) -> str:
    return next((c for c, pattern in CATEGORIES if re.search(pattern, name)), "other")


PREFILL_RUNS = 20


def times_by_name(prof, cuda: bool) -> dict[str, float]:
    """us per kernel (GPU) or per op, self time (CPU), summed over the profiled window. On a
    GPU only the device's own events count (a CPU op's device time is its kernels')."""
    from torch.autograd import DeviceType

    out: dict[str, float] = {}
    for e in prof.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        if t > 0:
            out[e.key] = out.get(e.key, 0.0) + t
    return out


def host_times(prof) -> dict[str, tuple[int, float]]:
    """(calls, self CPU time in us) per CPU op, summed over the profiled window."""
    return {
        e.key: (e.count, e.self_cpu_time_total)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    }


def host_summary(per_op: dict[str, tuple[int, float]], top: int = 30) -> list:
    rows = sorted(per_op.items(), key=lambda kv: -kv[1][1])[:top]
    return [(name[:120], calls, round(t, 1)) for name, (calls, t) in rows]


def summary(per_name: dict[str, float], wall_us: float, top: int = 25) -> dict:
    cats: dict[str, float] = {}
    for name, t in per_name.items():
        cats[category(name)] = cats.get(category(name), 0.0) + t
    rows = sorted(per_name.items(), key=lambda kv: -kv[1])[:top]
    return dict(
        wall_us=round(wall_us, 1),
        kernel_us=round(sum(per_name.values()), 1),
        categories={c: round(t, 1) for c, t in sorted(cats.items(), key=lambda kv: -kv[1])},
        top=[(name[:160], round(t, 1), category(name)) for name, t in rows],
    )


def start_profiler(worker, host: bool) -> None:
    """In each worker (vLLM's collective_rpc): starts a profiler of the GPU's kernels, and
    with ``host`` (always on CPU) of the CPU ops."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    if host:
        activities.append(ProfilerActivity.CPU)
    worker.nemotron_h_profiler = profile(activities=activities)
    worker.nemotron_h_profiler.start()


def stop_profiler(worker) -> tuple[dict[str, float], dict[str, tuple[int, float]]]:
    """In each worker: stops its profiler; (us per kernel or op, host time per op)."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    prof = worker.nemotron_h_profiler
    prof.stop()
    return times_by_name(prof, cuda), host_times(prof)


def child(
    model: str, state_dtype: str, batches: list[int], decode_steps: int, host: bool, tp: int
) -> dict:
    import torch

    from vllm_nemotron_h.testing import model_class_name

    check_moe_routing()
    cuda = torch.cuda.is_available()
    # TP=1, the "uni" executor: the model runs in this process; else one process per rank
    engine = dict(tensor_parallel_size=tp, distributed_executor_backend="uni" if tp == 1 else "mp")
    # one engine for every batch: an engine start costs more than a batch's profile
    llm = build_llm(model, state_dtype, batches, decode_steps + 1, **engine)
    return dict(
        model_class=llm.apply_model(model_class_name)[0],
        device=torch.cuda.get_device_name() if cuda else "cpu",
        steps={str(b): profile_batch(llm, b, decode_steps, host or not cuda) for b in batches},
    )


def profile_batch(llm, batch: int, decode_steps: int, host: bool) -> dict:
    """The prefill and decode steps of ``batch`` prompts on ``llm`` (see the module doc)."""
    import statistics

    import torch
    from vllm import SamplingParams

    cuda = torch.cuda.is_available()
    prompts = random_prompts(llm, batch, torch.Generator().manual_seed(0))

    def generate(n: int) -> None:
        p = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        llm.generate(prompts, p, use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()

    generate(decode_steps + 1)  # warm-up: compiles, autotunes, fills caches
    prefill_walls = []
    for _ in range(PREFILL_RUNS):
        start = time.perf_counter()
        generate(1)
        prefill_walls.append(1e6 * (time.perf_counter() - start))
    ranks = {}  # decode steps -> per rank (times, host times)
    walls = {}
    for n in (1, decode_steps + 1):
        llm.collective_rpc(start_profiler, args=(host,))
        start = time.perf_counter()
        generate(n)
        walls[n] = 1e6 * (time.perf_counter() - start)
        ranks[n] = llm.collective_rpc(stop_profiler)
    decode_kernel_us_by_rank = [
        (sum(long.values()) - sum(short.values())) / decode_steps
        for (short, _), (long, _) in zip(ranks[1], ranks[decode_steps + 1])
    ]
    (short, short_host), (long, _) = ranks[1][0], ranks[decode_steps + 1][0]
    short_wall, long_wall = walls[1], walls[decode_steps + 1]
    decode = {k: (long.get(k, 0.0) - short.get(k, 0.0)) / decode_steps for k in long}
    decode = {k: t for k, t in decode.items() if t > 0}
    # per rank: a rank that launches late shows as the others' all-reduce kernels waiting
    decode_host_by_rank = [
        per_step_host(s_host, l_host, decode_steps)
        for (_, s_host), (_, l_host) in zip(ranks[1], ranks[decode_steps + 1])
    ]
    decode_host = decode_host_by_rank[0]
    prefill = summary(short, short_wall)
    prefill["unprofiled_wall_us"] = dict(
        median=round(statistics.median(prefill_walls), 1), min=round(min(prefill_walls), 1)
    )
    decode_step = summary(decode, (long_wall - short_wall) / decode_steps)
    decode_step["kernel_us_by_rank"] = [round(t, 1) for t in decode_kernel_us_by_rank]
    if host:
        prefill["host"] = host_summary(short_host)
        decode_step["host"] = host_summary(decode_host)
        if len(decode_host_by_rank) > 1:
            decode_step["host_by_rank"] = [host_summary(h, 15) for h in decode_host_by_rank]
    return dict(prefill_step=prefill, decode_step=decode_step)


def per_step_host(
    short: dict[str, tuple[int, float]], long: dict[str, tuple[int, float]], steps: int
) -> dict[str, tuple[float, float]]:
    """(calls, self us) per host op of one decode step: the long run's less the short run's,
    over its ``steps`` decode steps; ops that took no more time in the long run left out."""
    per_step = {
        k: ((c - short.get(k, (0, 0.0))[0]) / steps, (t - short.get(k, (0, 0.0))[1]) / steps)
        for k, (c, t) in long.items()
    }
    return {k: v for k, v in per_step.items() if v[1] > 0}


def print_table(res: dict[str, dict]) -> None:
    impls = list(res)
    for step in ("prefill_step", "decode_step"):
        cats = sorted({c for r in res.values() for c in r[step]["categories"]})
        print(f"\n{step} (us)" + "".join(f"{i:>14}" for i in impls))
        for c in cats:
            print(
                f"  {c:32}"
                + "".join(f"{res[i][step]['categories'].get(c, 0):14.1f}" for i in impls)
            )
        for key in ("kernel_us", "wall_us"):
            print(f"  {key:32}" + "".join(f"{res[i][step][key]:14.1f}" for i in impls))
    print("\ndecode step kernel us by rank")
    for i in impls:
        print(
            f"  {i:32}" + "".join(f"{t:14.1f}" for t in res[i]["decode_step"]["kernel_us_by_rank"])
        )
    print("\nprefill step without the profiler, median (min) us")
    for i in impls:
        walls = res[i]["prefill_step"]["unprofiled_wall_us"]
        print(f"  {i:32}{walls['median']:14.1f} ({walls['min']:.1f})")
    for step in ("prefill_step", "decode_step"):
        for i in impls:
            if "host" not in res[i][step]:
                continue
            print(f"\nhost time of the {step.replace('_', ' ')} by op, {i}: calls, self us")
            for name, calls, t in res[i][step]["host"][:15]:
                print(f"  {name[:70]:70}{calls:8}{t:12.1f}")
    for i in impls:
        for rank, rows in enumerate(res[i]["decode_step"].get("host_by_rank", [])[1:], 1):
            print(f"\nhost time of the decode step by op, {i}, rank {rank}: calls, self us")
            for name, calls, t in rows[:8]:
                print(f"  {name[:70]:70}{calls:8}{t:12.1f}")


def main() -> None:
    if answer_child(child):
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nemotron-h-8b", help="a real shape or a tiny preset")
    ap.add_argument("--state-dtype", default="float32")
    ap.add_argument("--batches", default="1", help="comma-separated, one engine for all")
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--impls", default="builtin,plugin")
    ap.add_argument("--host", action="store_true", help="also the host's time by op (slower)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument(
        "--moe-routing",
        default=None,
        help="vLLM's MoE routing simulation for both implementations (as e2e.py's)",
    )
    ap.add_argument("--output-dir", type=Path, default=RESULTS, help="where the JSONs go")
    args = ap.parse_args()
    routing = {MOE_ROUTING_ENV: args.moe_routing} if args.moe_routing else {}
    batches = [int(b) for b in args.batches.split(",")]
    spec = dict(
        model=args.model,
        state_dtype=args.state_dtype,
        batches=batches,
        decode_steps=args.decode_steps,
        host=args.host,
        tp=args.tensor_parallel_size,
    )
    tp_tag = f"-tp{args.tensor_parallel_size}" if args.tensor_parallel_size > 1 else ""
    res: dict[str, dict] = {}
    for impl in args.impls.split(","):
        # the engine in the child's own process: the profiler sees only that process. Its
        # ranks are spawned: forked from it, they failed at start on 4 H100s (no trace)
        res[impl] = run_impl(
            __file__, impl, spec, VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_WORKER_MULTIPROC_METHOD="spawn", **routing,
        )  # fmt: skip
        # written after each implementation: a time limit that cuts the second keeps the first
        for batch in batches:
            write_batch(args, batch, res, tp_tag)
    for batch in batches:
        print(f"\nbatch {batch}")
        print_table({impl: r["steps"][str(batch)] for impl, r in res.items()})


def write_batch(args: argparse.Namespace, batch: int, res: dict[str, dict], tp_tag: str) -> None:
    """One batch's file: meta, then per implementation its class, device and steps."""
    device = next(iter(res.values()))["device"]
    by_impl = {
        impl: dict(model_class=r["model_class"], device=r["device"], **r["steps"][str(batch)])
        for impl, r in res.items()
    }
    routing = f"-{args.moe_routing}-routing" if args.moe_routing else ""
    name = (
        f"step-profile-{args.model}-{args.state_dtype}-b{batch}{tp_tag}{routing}-"
        f"{device_tag(device)}"
    )
    meta = dict(
        vars(args), output_dir=str(args.output_dir), batch=batch, prompt_len=PROMPT_LEN,
        date=time.strftime("%Y-%m-%d"), device=device,
    )  # fmt: skip
    path = args.output_dir / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(meta=meta, **by_impl), indent=1))
    print(f"wrote {path} ({', '.join(by_impl)})", flush=True)


if __name__ == "__main__":
    main()
