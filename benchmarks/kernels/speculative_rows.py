"""Host time of one KV-cache group's speculative step rows (ops/speculative_rows): the op's one
launch against the same in PyTorch ops (its CPU path run on the device's tensors: the
builder's ops before the op existed), at several row counts, with vLLM's accepted counts
given and with the builder counting (vLLM 0.26 in steps without drafts records or counts in
every step). Host time is what matters: under speculative decoding every Mamba cache group
builds its metadata every step (8 groups on the 8B) on the host before the step's forward,
and the device work is a few microseconds. Median of --runs loops of --calls
calls, the device synchronized at each loop's end (per call that is the host's time).

    python benchmarks/kernels/speculative_rows.py [--rows 1,32,128] [--drafts 3]

Writes benchmarks/results/kernels-speculative_rows-<device>.json (+ .png); on a machine
without a GPU the PyTorch column alone (the op runs it there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vllm_nemotron_h.ops.speculative_rows import interface
from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows
from vllm_nemotron_h.ops.speculative_rows.cpu import speculative_rows_cpu

RESULTS = Path(__file__).resolve().parent.parent / "results"
MAX_ROWS, NUM_SLOTS = 256, 2048


def per_call_us(fn: Callable[[], object], calls: int, runs: int, device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def step_inputs(rows: int, k: int, device: torch.device, counting: bool):
    """vLLM's metadata of a step of ``rows`` decode rows of k tokens (int32, the slot table a
    column block of a wider table), the builder's buffers, and its record when counting."""
    table = torch.randperm(NUM_SLOTS, device=device)[: rows * (k + 1)].view(rows, k + 1)
    table = table.to(torch.int32)[:, :k]
    starts = torch.arange(0, k * (rows + 1), k, dtype=torch.int32, device=device)
    accepted = torch.randint(1, k + 1, (rows,), dtype=torch.int32, device=device)
    out = RowBuffers(
        torch.empty((MAX_ROWS, k), dtype=torch.int64, device=device),
        torch.empty(MAX_ROWS + 1, dtype=torch.int64, device=device),
        torch.empty(MAX_ROWS, dtype=torch.int64, device=device),
    )
    count = None
    if counting:
        count = AcceptedCount(
            torch.zeros(NUM_SLOTS, dtype=torch.int64, device=device),
            torch.empty(0, dtype=torch.int32, device=device),
            torch.full((rows,), 100, dtype=torch.int32, device=device),
            starts,
            rows,
            rows,
        )
    return StepRows(table, starts, accepted), out, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,32,128")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tag = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    k = 1 + args.drafts
    results = []
    print(f"{'rows':>5} {'counting':>9} {'op_us':>8} {'pytorch_us':>11}")
    for rows in [int(r) for r in args.rows.split(",")]:
        for counting in (False, True):
            step, out, count = step_inputs(rows, k, device, counting)
            interface.check(step, out, count)
            torch_us = per_call_us(
                lambda: speculative_rows_cpu(step, out, count), args.calls, args.runs, device
            )
            op_us = None
            if device.type == "cuda":
                op_us = per_call_us(
                    lambda: interface.run(step, out, count), args.calls, args.runs, device
                )
            results.append(dict(rows=rows, counting=counting, op_us=op_us, pytorch_us=torch_us))
            op = "-" if op_us is None else f"{op_us:.1f}"
            print(f"{rows:>5} {counting!s:>9} {op:>8} {torch_us:>11.1f}")
    meta = dict(
        device=tag, torch=torch.__version__, drafts=args.drafts, calls=args.calls,
        runs=args.runs, date=time.strftime("%Y-%m-%d"),
    )  # fmt: skip
    short = "h100" if "H100" in tag else tag.replace(" ", "_").lower()
    path = args.output or RESULTS / f"kernels-speculative_rows-{short}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=results), indent=1))
    plot(results, path.with_suffix(".png"), meta)
    print(f"wrote {path} and its .png")


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), squeeze=False)
    for ax, counting in zip(axes[0], (False, True)):
        sel = [r for r in rows if r["counting"] == counting]
        x = [r["rows"] for r in sel]
        ax.plot(x, [r["pytorch_us"] for r in sel], "x--", label="PyTorch ops")
        if all(r["op_us"] is not None for r in sel):
            ax.plot(x, [r["op_us"] for r in sel], "o-", label="ops/speculative_rows")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("decode rows")
        ax.set_ylabel("host us per call")
        ax.set_title("counting" if counting else "counts given", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"{meta['device']}, torch {meta['torch']}, {meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
