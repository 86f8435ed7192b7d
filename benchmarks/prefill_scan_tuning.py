"""How fast vLLM's chunked-scan prefill runs with the configs its autotuners choose, by where
they choose them: at one chunk of one sequence (the shape of vLLM's profile-run warm-up) or
at the plugin's tuning prefill (``vllm_boundary.prefill.tune_scan``: 32 one-chunk sequences).

An autotuner keeps one config per kernel and dtypes for every token count, chosen by timing
each config once at the first shape it sees. Per model shape and ``--trials`` times each:
every choice dropped, the five kernels tuned the one way or the other (with and without
initial states), then one layer's scan of P prompts of 128 tokens timed with those choices
(the plugin's launches: no autotuner per launch) as the median over ``--iterations`` batches
of 10 back-to-back calls between CUDA events, per call. P=1 may wait on the host.

    python benchmarks/prefill_scan_tuning.py --output benchmarks/results/F.json  # GPU only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from prefill_scan_host_time import MODELS, gpu_meta, scan_weights

from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES

CHUNK_SIZE = 128  # the 128-token prompts are one chunk each
CALLS = 10
POLICIES = ("one chunk (vLLM's warm-up)", "tune_scan (32 chunks)")


def drop_choices() -> None:
    """Every scan autotuner's choices and the plugin's launches of them forgotten, and the
    autotuners' disk cache off: vLLM sets TRITON_CACHE_AUTOTUNING=1, under which a cleared
    autotuner loads the choice an earlier tuning left on disk instead of tuning again."""
    from vllm_nemotron_h.vllm_boundary.prefill import SCAN_KERNELS, TunedScanKernels

    for module, name in SCAN_KERNELS:
        autotuner = getattr(module, name)
        autotuner.cache.clear()
        autotuner.cache_results = False
    TunedScanKernels._launches.clear()


def scan_call(w, prompts: int, state_dtype: torch.dtype, initial: bool):
    """One layer's scan of ``prompts`` one-chunk prompts, laid out as a layer's prefill."""
    from vllm_nemotron_h.vllm_boundary import prefill

    p = prefill.tuning_inputs(w, CHUNK_SIZE, prompts, torch.bfloat16, state_dtype, "cuda")
    init = p.initial_states if initial else None

    def call() -> torch.Tensor:
        return prefill._scan(
            p.md, w, p.x, p.B, p.C, p.dt, p.out, init, state_dtype, False, p.cu_seqlens,
            p.chunks,
        )  # fmt: skip

    return call


def tune(policy: str, w, state_dtype: torch.dtype) -> dict[str, list[str]]:
    """Tunes the way ``policy`` names; returns each kernel's chosen configs."""
    from vllm_nemotron_h.vllm_boundary import prefill

    drop_choices()
    if policy == POLICIES[0]:
        for initial in (False, True):
            scan_call(w, 1, state_dtype, initial)()
    else:
        tokens = prefill.TUNING_SEQUENCES * CHUNK_SIZE
        prefill.tune_scan(w, CHUNK_SIZE, tokens, torch.bfloat16, state_dtype, torch.device("cuda"))
    torch.cuda.synchronize()
    return {
        name: sorted(str(c) for c in getattr(module, name).cache.values())
        for module, name in prefill.SCAN_KERNELS
    }


def time_us(call, iterations: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(iterations):
        start.record()
        for _ in range(CALLS):
            call()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / CALLS)
    return round(statistics.median(per_call), 1)


def plot(rows: list[dict], path: Path, meta: dict, prompts: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for k, policy in enumerate(POLICIES):
            trials = [r for r in rows if r["model"] == model and r["policy"] == policy]
            for t, r in enumerate(trials):
                ax.scatter(
                    [i + 0.3 * k for i in range(len(prompts))],
                    [r["scan_us"][str(p)] / r["scan_us_best"][str(p)] for p in prompts],
                    color=f"C{k}", label=policy if t == 0 else None,
                )  # fmt: skip
        ax.set_xticks([i + 0.15 for i in range(len(prompts))])
        ax.set_xticklabels([f"{p} x 128 tok" for p in prompts])
        ax.set_ylabel("scan time / the best trial's at that shape")
        ax.set_title(model)
        ax.legend()
    fig.suptitle(f"vLLM's prefill scan by where its configs were tuned, {meta['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--prompts", default="1,32,128", help="prompts of the timed scans")
    ap.add_argument("--state-dtype", default="bfloat16")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    meta = gpu_meta(
        "prefill_scan_tuning.py", state_dtype=args.state_dtype, trials=args.trials,
        iterations=args.iterations, calls_per_iteration=CALLS,
    )  # fmt: skip
    torch.manual_seed(0)
    prompts = [int(p) for p in args.prompts.split(",")]
    state_dtype = getattr(torch, args.state_dtype)
    rows = []
    for model in args.models.split(","):
        w = scan_weights(model)
        calls = {p: scan_call(w, p, state_dtype, False) for p in prompts}
        layers = REAL_SHAPES[model]["hybrid_override_pattern"].count("M")
        for trial in range(args.trials):
            for policy in POLICIES:
                t0 = time.time()
                picks = tune(policy, w, state_dtype)
                tune_s = round(time.time() - t0, 1)
                scan_us = {str(p): time_us(calls[p], args.iterations) for p in prompts}
                rows.append(dict(
                    model=model, mamba_layers=layers, trial=trial, policy=policy,
                    tune_s=tune_s, scan_us=scan_us, picks=picks,
                ))  # fmt: skip
                print(f"{model:14s} trial {trial} {policy:28s} tuned in {tune_s:5.1f} s  "
                      + "  ".join(f"P={p}: {scan_us[str(p)]:8.1f} us" for p in prompts),
                      flush=True)  # fmt: skip
        for r in rows:
            if r["model"] == model:
                same = [q for q in rows if q["model"] == model]
                r["scan_us_best"] = {
                    str(p): min(q["scan_us"][str(p)] for q in same) for p in prompts
                }
    for model in args.models.split(","):
        for policy in POLICIES:
            mine = [r for r in rows if r["model"] == model and r["policy"] == policy]
            worst = {p: max(r["scan_us"][str(p)] / r["scan_us_best"][str(p)] for r in mine)
                     for p in prompts}  # fmt: skip
            print(f"{model:14s} {policy:28s} worst trial / best: "
                  + "  ".join(f"P={p}: {worst[p]:.2f}x" for p in prompts))  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot(rows, args.output.with_suffix(".png"), meta, prompts)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
