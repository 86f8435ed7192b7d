"""Host time of one Mamba layer's chunked scan in a prefill step, on the GPU: vLLM's wrapper as
its model calls it (each of the five kernels launched through Triton's autotuner) against the
plugin's ``scan_prefill`` (the same wrapper and kernels, launched with the configs the
autotuners chose, resolved once per scan signature: vllm_boundary/prefill.py).

Each call starts on an idle GPU (synchronised before, outside the timing), so its wall time
is the host's: launches do not wait. The two alternate call by call, and which goes first
alternates too. Also per call: the span from a CUDA event before it to one after it (host
and kernels, whichever is longer), and whether both give the same y and final states.

    python benchmarks/prefill_scan_host_time.py --output benchmarks/results/F.json  # GPU only
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES
from vllm_nemotron_h.testing.op_inputs import prefill_chunks

MODELS = ("nemotron-h-8b", "nano-9b-v2")
CHUNK_SIZE = 128


def gpu_meta(script: str, **fields) -> dict:
    """The GPU and versions a scan benchmark runs with, and ``fields``; exits without a GPU."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} times vLLM's Triton scan: it needs a GPU")
    import triton
    import vllm

    return dict(
        gpu=torch.cuda.get_device_name(), vllm=vllm.__version__, torch=torch.__version__,
        triton=triton.__version__, python=platform.python_version(),
        date=time.strftime("%Y-%m-%d"), **fields,
    )  # fmt: skip


def scan_weights(model: str):
    """Random scan parameters of one layer of ``model``'s shape on the GPU (D and dt_bias in
    fp32, as the plugin keeps them)."""
    from vllm_nemotron_h.vllm_boundary.prefill import ScanWeights

    cfg = REAL_SHAPES[model]
    heads, dev = cfg["mamba_num_heads"], "cuda"
    return ScanWeights(
        -torch.rand(heads, device=dev) - 0.5, torch.randn(heads, device=dev),
        torch.randn(heads, device=dev), heads, cfg["mamba_head_dim"], cfg["n_groups"],
        cfg["ssm_state_size"], 3,
    )  # fmt: skip


def layer_calls(model: str, prompts: int, prompt_len: int, state_dtype: torch.dtype):
    """vLLM's scan and the plugin's on one layer of ``model``'s shape, on the same inputs,
    each writing its own y; both return the final states."""
    from vllm.model_executor.layers.mamba.ops.ssd_combined import (
        mamba_chunk_scan_combined_varlen,
    )

    from vllm_nemotron_h.vllm_boundary.prefill import scan_prefill

    w = scan_weights(model)
    heads, head_dim, groups, d_state = w.heads, w.head_dim, w.groups, w.d_state
    n, dev, act = prompts * prompt_len, "cuda", torch.bfloat16
    x = torch.randn(n, heads * head_dim, device=dev, dtype=act)
    B, C = torch.randn(2, n, groups * d_state, device=dev, dtype=act)
    dt = torch.randn(n, heads, device=dev, dtype=act)
    md = prefill_chunks([prompt_len] * prompts, CHUNK_SIZE, dev)
    outs = {"vllm": torch.empty_like(x), "plugin": torch.empty_like(x)}

    def vllm_scan() -> torch.Tensor:
        return mamba_chunk_scan_combined_varlen(
            x.view(n, heads, head_dim), dt, w.A, B.view(n, groups, -1), C.view(n, groups, -1),
            chunk_size=CHUNK_SIZE, D=w.D, z=None, dt_bias=w.dt_bias, seq_idx=md.seq_idx_p,
            cu_seqlens=md.query_start_loc_p, cu_chunk_seqlens=md.cu_chunk_seqlen_p,
            last_chunk_indices=md.last_chunk_indices_p, initial_states=None,
            return_intermediate_states=False, dt_softplus=True, dt_limit=(0.0, float("inf")),
            out=outs["vllm"].view(n, heads, head_dim), state_dtype=state_dtype,
        )  # fmt: skip

    def plugin_scan() -> torch.Tensor:
        return scan_prefill(
            md, w, x, B, C, dt, outs["plugin"], None, None, None, None, state_dtype, None
        )

    return {"vllm": vllm_scan, "plugin": plugin_scan}, outs


def measure(calls: dict, iterations: int) -> dict[str, dict[str, list[float]]]:
    """Per implementation: host microseconds per call (an idle GPU at each call's start) and
    the CUDA-event span of each call."""
    times = {name: {"host_us": [], "span_us": []} for name in calls}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(calls)
    for i in range(iterations):
        for name in names if i % 2 == 0 else names[::-1]:
            torch.cuda.synchronize()
            start.record()
            t0 = time.perf_counter()
            calls[name]()
            t1 = time.perf_counter()
            end.record()
            torch.cuda.synchronize()
            times[name]["host_us"].append((t1 - t0) * 1e6)
            times[name]["span_us"].append(start.elapsed_time(end) * 1e3)
    return times


def quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=10)
    return {"median": round(statistics.median(values), 1), "p10": round(q[0], 1),
            "p90": round(q[-1], 1)}  # fmt: skip


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({(r["model"], r["prompts"], r["state_dtype"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4))
    for k, impl in enumerate(("vllm", "plugin")):
        medians = [
            next(r["host_us"]["median"] for r in rows
                 if (r["model"], r["prompts"], r["state_dtype"]) == label and r["impl"] == impl)
            for label in labels
        ]  # fmt: skip
        ax.bar([i + 0.4 * k for i in range(len(labels))], medians, width=0.4,
               label="vLLM's scan (autotuner per launch)" if impl == "vllm"
               else "plugin's scan (tuned configs resolved once)")  # fmt: skip
    ax.set_xticks([i + 0.2 for i in range(len(labels))])
    ax.set_xticklabels([f"{m}\n{p} x {meta['prompt_len']} tok\n{s}" for m, p, s in labels])
    ax.set_ylabel("host time per layer call, us (median)")
    ax.set_title(f"Mamba2 prefill scan host time, {meta['gpu']}, vLLM {meta['vllm']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--prompts", default="1,32", help="prompts per prefill step")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--state-dtypes", default="bfloat16,float32")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    meta = gpu_meta(
        "prefill_scan_host_time.py", prompt_len=args.prompt_len, iterations=args.iterations
    )
    torch.manual_seed(0)
    rows = []
    for model in args.models.split(","):
        layers = REAL_SHAPES[model]["hybrid_override_pattern"].count("M")
        for prompts in map(int, args.prompts.split(",")):
            for dtype_name in args.state_dtypes.split(","):
                state_dtype = getattr(torch, dtype_name)
                calls, outs = layer_calls(model, prompts, args.prompt_len, state_dtype)
                states = {name: call() for name, call in calls.items()}  # tune, resolve
                same = torch.equal(outs["vllm"], outs["plugin"]) and torch.equal(
                    states["vllm"], states["plugin"]
                )
                times = measure(calls, args.iterations)
                for impl, t in times.items():
                    host, span = quantiles(t["host_us"]), quantiles(t["span_us"])
                    rows.append(dict(
                        model=model, mamba_layers=layers, prompts=prompts,
                        state_dtype=dtype_name, impl=impl, host_us=host, span_us=span,
                        host_ms_per_step=round(host["median"] * layers / 1e3, 2),
                        same_y_and_states=same,
                    ))  # fmt: skip
                saved = rows[-2]["host_us"]["median"] - rows[-1]["host_us"]["median"]
                print(
                    f"{model:14s} {prompts:3d} x {args.prompt_len} {dtype_name:9s} host us "
                    f"vLLM {rows[-2]['host_us']['median']:7.1f} plugin "
                    f"{rows[-1]['host_us']['median']:7.1f} (saved {saved:6.1f}/layer, "
                    f"{saved * layers / 1e3:5.2f} ms/step of {layers} layers)  span "
                    f"{rows[-2]['span_us']['median']:7.1f} / {rows[-1]['span_us']['median']:7.1f}"
                    f"  same y and states: {same}",
                    flush=True,
                )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot(rows, args.output.with_suffix(".png"), meta)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
