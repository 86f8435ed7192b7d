"""What ``tune_scan`` costs an engine start, by start: the first on an empty Triton cache
directory (every config of the five scan kernels compiled and timed), then later starts on the
same directory, which load the choices the first one left (``vllm_boundary.prefill.
tuning_cache``).

Each start is a new process (as an engine start is) that imports vLLM (whose env_override sets
TRITON_CACHE_AUTOTUNING=1), optionally launches one small Triton kernel first (the driver and
its launcher built: ``--warm-triton``, as in an engine whose compiled graphs ran before the
first Mamba layer), then calls ``tune_scan`` for one layer of the model's shape under
cProfile. Per start: the wall time, how many configs the autotuners benchmarked, how many
kernels Triton compiled and loaded, and the functions that took the most time.

    python benchmarks/scan_tuning_start.py --output benchmarks/results/F.json  # GPU only
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

from child_process import answer_child, run_impl

CHUNK_SIZE = 128
# (label, module path fragment, function name): the calls counted in each start's profile
# (the autotuners' own calls are counted by wrappers, see counting_autotuners)
COUNTED = (
    ("kernels made ready to launch", "compiler/compiler.py", "_init_handles"),
    ("kernels assembled (ptxas)", "backends/nvidia/compiler.py", "make_cubin"),
    ("C modules built", "triton/", "compile_module_from_src"),
    ("triton_key hashes", "triton/", "triton_key"),
)
TOP = 25
AUTOTUNER_CALLS = ("configs benchmarked", "disk-cache hits", "disk-cache misses")


def child(model: str, state_dtype: str, warm_triton: bool) -> dict:
    import torch
    import vllm.env_override  # noqa: F401  (what an engine process sets for Triton)
    from prefill_scan_host_time import scan_weights

    from vllm_nemotron_h.vllm_boundary import prefill

    started = time.perf_counter()
    w = scan_weights(model)
    if warm_triton:
        torch.cumsum(torch.ones(8, device="cuda"), 0)  # CUDA context, no Triton
        _tiny_triton_kernel()
    torch.cuda.synchronize()
    before_s = time.perf_counter() - started
    autotuners = counting_autotuners()
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    prefill.tune_scan(
        w, CHUNK_SIZE, prefill.TUNING_SEQUENCES * CHUNK_SIZE, torch.bfloat16,
        getattr(torch, state_dtype), torch.device("cuda"),
    )  # fmt: skip
    torch.cuda.synchronize()
    profile.disable()
    tune_s = time.perf_counter() - t0
    stats = pstats.Stats(profile)
    counted = {label: 0 for label, _, _ in COUNTED} | autotuners["calls"]
    counted_s = {label: 0.0 for label, _, _ in COUNTED} | autotuners["seconds"]
    rows = []
    for (path, _, name), (_, calls, own_s, cum_s, _) in stats.stats.items():
        for label, fragment, fn in COUNTED:
            if name == fn and fragment in path:
                counted[label] += calls
                counted_s[label] += cum_s
        rows.append((cum_s, own_s, calls, f"{_short(path)}:{name}"))
    rows.sort(reverse=True)
    from triton.runtime import autotuner

    # what the autotuners' disk-cache key takes from the environment (None: not found)
    cache_env = getattr(autotuner, "get_cache_invalidating_env_vars", lambda: None)()
    return dict(
        before_s=round(before_s, 2), tune_s=round(tune_s, 2), counted=counted,
        cache_env=cache_env,
        counted_s={k: round(v, 2) for k, v in counted_s.items()},
        top=[dict(function=f, cumulative_s=round(c, 3), own_s=round(o, 3), calls=n)
             for c, o, n, f in rows[:TOP]],
    )  # fmt: skip


def counting_autotuners() -> dict[str, dict]:
    """Counts (and times) every config an autotuner benchmarks and every disk-cache lookup,
    hit or miss, from now on in this process (wrappers of Triton's Autotuner methods: a
    profile of a first start did not attribute these calls)."""
    from triton.runtime.autotuner import Autotuner

    found = {
        "calls": dict.fromkeys(AUTOTUNER_CALLS, 0),
        "seconds": dict.fromkeys(AUTOTUNER_CALLS, 0.0),
    }
    bench, check = Autotuner._bench, Autotuner.check_disk_cache

    def tally(label: str, seconds: float) -> None:
        found["calls"][label] += 1
        found["seconds"][label] += seconds

    def counted_bench(self, *args, **kwargs):
        t0 = time.perf_counter()
        result = bench(self, *args, **kwargs)
        tally("configs benchmarked", time.perf_counter() - t0)
        return result

    def counted_check(self, *args, **kwargs):
        t0 = time.perf_counter()
        hit = check(self, *args, **kwargs)
        tally("disk-cache hits" if hit else "disk-cache misses", time.perf_counter() - t0)
        return hit

    Autotuner._bench, Autotuner.check_disk_cache = counted_bench, counted_check
    return found


def _tiny_triton_kernel() -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n: tl.constexpr):
        offsets = tl.arange(0, n)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1)

    add_one[(1,)](torch.zeros(16, device="cuda"), 16)


def _short(path: str) -> str:
    parts = Path(path).parts
    # the kit installs vLLM and Triton into a directory of its own (vllm-site)
    for root, skip in (
        ("site-packages", 1),
        ("vllm-site", 1),
        ("vllm_nemotron_h", 0),
        ("benchmarks", 0),
    ):
        if root in parts:
            return "/".join(parts[parts.index(root) + skip :])
    return path


def cache_entries(directory: Path) -> dict[str, int]:
    files = [p for p in directory.rglob("*") if p.is_file()] if directory.exists() else []
    return dict(
        files=len(files), autotune_json=sum(p.name.endswith(".autotune.json") for p in files),
        cubins=sum(p.suffix == ".cubin" for p in files),
    )  # fmt: skip


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['model']}\nstart {r['start']}" for r in rows]
    ax.bar(range(len(rows)), [r["tune_s"] for r in rows], color="C0", label="tune_scan")
    ax.bar(range(len(rows)), [r["counted_s"]["configs benchmarked"] for r in rows],
           color="C1", label="of it: benchmarking configs")  # fmt: skip
    for i, r in enumerate(rows):
        ax.text(i, r["tune_s"], f"{r['counted']['configs benchmarked']} benched\n"
                f"{r['counted']['kernels assembled (ptxas)']} assembled",
                ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title(f"tune_scan by engine start on one Triton cache directory, {meta['gpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="nemotron-h-8b,nano-9b-v2")
    ap.add_argument("--state-dtype", default="bfloat16")
    ap.add_argument("--starts", type=int, default=3, help="processes per model, in turn")
    ap.add_argument("--warm-triton", action="store_true")
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    from prefill_scan_host_time import gpu_meta

    meta = gpu_meta(
        "scan_tuning_start.py", state_dtype=args.state_dtype, starts=args.starts,
        warm_triton=args.warm_triton,
    )  # fmt: skip
    from vllm_nemotron_h.vllm_boundary.prefill import TUNING_CACHE_PREFIX, TUNING_SEQUENCES

    rows = []
    for model in args.models.split(","):
        cache_dir = Path(tempfile.mkdtemp(prefix="scan-tuning-start-"))
        own = cache_dir / f"{TUNING_CACHE_PREFIX}-{TUNING_SEQUENCES}-chunks"
        for start in range(1, args.starts + 1):
            spec = dict(model=model, state_dtype=args.state_dtype, warm_triton=args.warm_triton)
            found = run_impl(__file__, "plugin", spec, TRITON_CACHE_DIR=str(cache_dir))
            row = dict(model=model, start=start, **found, own_dir_after=cache_entries(own),
                       triton_dir_after=cache_entries(cache_dir))  # fmt: skip
            rows.append(row)
            print(f"{model:14s} start {start}: tune_scan {row['tune_s']:6.2f} s (process ready "
                  f"{row['before_s']:.2f} s)  " + "  ".join(
                      f"{k} {v} ({row['counted_s'][k]:.2f} s)" for k, v in row["counted"].items()
                  ), flush=True)  # fmt: skip
            for top in row["top"][:12]:
                print(
                    f"    {top['cumulative_s']:8.3f} s cum {top['own_s']:8.3f} s own "
                    f"{top['calls']:6d}x  {top['function']}"
                )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot(rows, args.output.with_suffix(".png"), meta)
    print("wrote", args.output)


if __name__ == "__main__":
    if not answer_child(child):
        main()
