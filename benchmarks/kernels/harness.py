"""The timing harness every kernel benchmark shares: CUDA-graph replays (median) of L launches
over L rotating input sets (together larger than L2), the bytes a kernel must move against
the measured copy roofline, and what a plain device copy of the same bytes takes in the same
harness (what any streaming kernel of that size can reach: launch and ramp included). Rows
are printed as they are measured and written as JSON + PNG under benchmarks/results/."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import itertools
import json
import math
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import triton

from vllm_nemotron_h import testing
from vllm_nemotron_h.ops import launch_config
from vllm_nemotron_h.testing.op_inputs import Draw, MambaShape

RESULTS = Path(__file__).resolve().parent.parent / "results"
BATCHES = (1, 8, 32, 64, 128, 256)
STATE_DTYPES = ("float32", "bfloat16")
ROTATE_BYTES = 512 << 20
ACT = torch.bfloat16


def copy_roofline() -> float:
    """Bytes/s of a 1 GiB device copy, read + write counted."""
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() * 4 / (ms * 1e-3)


def time_rotating(make_call: Callable[[], Callable[[], object]], bytes_per_call: int) -> float:
    """Microseconds per call: a CUDA graph of L calls, each on its own input set."""
    sets = max(2, min(64, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))
    calls = [make_call() for _ in range(sets)]
    # do_bench_cudagraph runs the calls on a stream of its own, which does not wait for the
    # default stream that made the inputs: without this sync the first call could read slot
    # indices not yet written.
    torch.cuda.synchronize()

    def run():
        for c in calls:
            c()

    ms = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
    calls.clear()  # free the input sets before the next measurement
    torch.cuda.empty_cache()
    return ms * 1e3 / sets


@functools.cache
def copy_us(nbytes: int) -> float:
    """Microseconds that moving ``nbytes`` (half read, half written) takes a plain device copy
    in the same harness: the faster of a memcpy (``Tensor.copy_``) and an elementwise kernel
    (``torch.neg``)."""
    n = max(8, nbytes // 4)  # bf16 elements per side

    def make(op):
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        return lambda: op(src, dst)

    return min(
        time_rotating(lambda: make(lambda a, b: b.copy_(a)), nbytes),
        time_rotating(lambda: make(lambda a, b: torch.neg(a, out=b)), nbytes),
    )


def draw() -> Draw:
    """Benchmark inputs on the GPU (values do not matter to the timing; the seed is fixed)."""
    return Draw.seeded(0, "cuda")


def device_tag() -> str:
    """This GPU's results-file suffix ("h100", "h200"), as the end-to-end benchmarks name it."""
    return testing.device_tag(torch.cuda.get_device_name())


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Comparison:
    """Rows of (kernel, model, state dtype, batch): ours against an alternative, both against
    the roofline and against a copy of our bytes."""

    def __init__(self) -> None:
        self.roof = copy_roofline()
        self.rows: list[dict] = []
        print(f"{torch.cuda.get_device_name()}: copy roofline {self.roof / 1e9:.0f} GB/s")

    def roofline_share(self, nbytes: int, us: float) -> float:
        """The share of the copy roofline that moving ``nbytes`` in ``us`` reaches."""
        return round(nbytes / (us * 1e-6) / self.roof, 4)

    def record(
        self,
        kernel: str,
        model: str,
        state_dtype: str,
        batch: int,
        ours_us: float,
        vllm_us: float | None,
        ours_bytes: int,
        vllm_bytes: int,
        **extra: float,
    ) -> None:
        """One row; ``extra`` columns (e.g. another variant's time) are kept in the JSON.
        ``vllm_us`` None: vLLM is not installed here (its columns stay empty)."""
        copy = copy_us(ours_bytes)
        row = dict(
            kernel=kernel,
            model=model,
            state_dtype=state_dtype,
            batch=batch,
            ours_us=round(ours_us, 3),
            vllm_us=None if vllm_us is None else round(vllm_us, 3),
            ours_roofline=self.roofline_share(ours_bytes, ours_us),
            vllm_roofline=None if vllm_us is None else self.roofline_share(vllm_bytes, vllm_us),
            copy_us=round(copy, 3),
            copy_roofline=self.roofline_share(ours_bytes, copy),
            **extra,
        )
        self.rows.append(row)
        theirs = "vllm (not installed)"
        if vllm_us is not None:
            theirs = f"vllm {vllm_us:8.2f}us {100 * row['vllm_roofline']:5.1f}%"
            theirs += f"  x{vllm_us / ours_us:4.2f}"
        print(
            f"{kernel:22s} {model:12s} {state_dtype:9s} B={batch:4d} ours {ours_us:8.2f}us "
            f"{100 * row['ours_roofline']:5.1f}%  {theirs}  "
            f"copy {copy:8.2f}us {100 * row['copy_roofline']:5.1f}%"
            + "".join(f"  {k} {v}" for k, v in extra.items()),
            flush=True,
        )

    def write(self, path: Path) -> None:
        meta = dict(
            gpu=torch.cuda.get_device_name(),
            torch=torch.__version__,
            triton=triton.__version__,
            vllm=installed_version("vllm"),
            python=platform.python_version(),
            date=time.strftime("%Y-%m-%d"),
            roofline_GBps=round(self.roof / 1e9, 1),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(meta=meta, rows=self.rows), indent=1))
        plot(self.rows, path.with_suffix(".png"), meta)
        print("wrote", path)


def time_if_installed(
    package: str, make_call: Callable[[], Callable[[], object]], bytes_per_call: int
) -> float | None:
    """time_rotating of a call into ``package`` (vLLM's kernels), or None where it is not
    installed: the plugin's own columns can be timed on a GPU host before the vLLM kit."""
    if installed_version(package) is None:
        return None
    return time_rotating(make_call, bytes_per_call)


def installed_version(package: str) -> str | None:
    """``package``'s version, or None where it is not installed (the kernels need no vLLM)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def tables_of(sweep: Path | None) -> Iterator[None]:
    """With a tune.py sweep JSON: the launch tables derived from it take the place of the
    device file's for the keys the sweep measured (to see a sweep's effect before writing it
    with tune.py --tables --write)."""
    from sweep_tables import tuned_tables

    with contextlib.ExitStack() as stack:
        if sweep is not None:
            for name, table in tuned_tables(json.loads(sweep.read_text())).items():
                shipped = launch_config.table(name, torch.device("cuda"))
                if isinstance(shipped, dict):  # keyed by shape: keep the keys not swept
                    table = {**shipped, **table}
                stack.enter_context(launch_config.overridden(name, table))
                print("using", name, table, flush=True)
        yield


def parser(doc: str, state_dtypes: tuple[str, ...] = STATE_DTYPES) -> argparse.ArgumentParser:
    """The options every kernel benchmark takes."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default=",".join(MambaShape.distinct_models()))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--state-dtypes", default=",".join(state_dtypes))
    ap.add_argument("--use-tables", type=Path, help="compare with the tables of this sweep")
    ap.add_argument("--output", type=Path, help="JSON to write (default under results/)")
    return ap


Compare = Callable[[Comparison, str, list[torch.dtype], list[int]], None]


def run(compares: list[Compare], default_name: str, args: argparse.Namespace) -> None:
    """Runs ``compares`` over every model and writes one JSON + PNG."""
    state_dtypes = [getattr(torch, d) for d in args.state_dtypes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    with tables_of(args.use_tables):
        bench = Comparison()
        for model in args.models.split(","):
            for compare in compares:
                compare(bench, model, state_dtypes, batches)
    bench.write(args.output or RESULTS / f"{default_name}-{device_tag()}.json")


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = sorted({r["kernel"] for r in rows})
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(
        len(kernels), len(models), figsize=(5 * len(models), 3.2 * len(kernels)), squeeze=False
    )
    for (i, k), (j, m) in itertools.product(enumerate(kernels), enumerate(models)):
        ax = axes[i][j]
        for sdt in sorted({r["state_dtype"] for r in rows if r["kernel"] == k}):
            sel = [
                r for r in rows if r["kernel"] == k and r["model"] == m and r["state_dtype"] == sdt
            ]
            if not sel:
                continue
            b = [r["batch"] for r in sel]
            ax.plot(b, [100 * r["ours_roofline"] for r in sel], "o-", label=f"ours {sdt}")
            if all(r["vllm_roofline"] is not None for r in sel):
                ax.plot(b, [100 * r["vllm_roofline"] for r in sel], "x--", label=f"vLLM {sdt}")
            copy = [100 * r["copy_roofline"] for r in sel]
            ax.plot(b, copy, ":", color="grey", label=f"copy of the bytes {sdt}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 110)
        ax.set_title(f"{k} / {m}", fontsize=9)
        ax.set_ylabel("% of copy roofline")
        ax.legend(fontsize=6)
    fig.suptitle(f"{meta['gpu']}, vLLM {meta['vllm']}, triton {meta['triton']}, {meta['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
