"""The end of a prefill (the rows' gated group norm, the final states into their slots) as one
launch, on the GPU, against two alternatives: vLLM 0.26's Mamba2 layer (vLLM's gated norm
kernel and ``state[slots] = final_states``; float states), and the plugin's own separate
launches (its group norm and slot scatter, the int8 format's quantization in PyTorch before
it). Each prefill row has 128 tokens. Besides the device time of CUDA-graph replays
(``*_us``), ``*_eager_us`` is the wall time per call of calls launched back to back
without a graph: what a prefill step, which runs the mixer outside CUDA graphs, pays (the
host's launch cost where it exceeds the kernels').

    python benchmarks/kernels/mamba2_prefill_tail.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-mamba2_prefill_tail-<gpu>.json (+ .png).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import harness
import torch

from vllm_nemotron_h.ops import group_rms_norm, mamba2_prefill_tail, scatter_state_slots
from vllm_nemotron_h.ops.state_format import quantize
from vllm_nemotron_h.testing.op_inputs import MambaShape, group_norm_inputs, slot_copy_inputs

EPS = 1e-5
PROMPT_TOKENS = 128
EAGER_CALLS = 200


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype) -> dict:
    draw = harness.draw()
    t = group_norm_inputs(draw, shape, batch * PROMPT_TOKENS, harness.ACT)
    per_slot = (shape.nheads, shape.head_dim, shape.d_state)
    quantized = state_dtype == torch.int8
    states = slot_copy_inputs(draw, per_slot, batch, torch.float32 if quantized else state_dtype)
    t.update(states, scale=None)
    if quantized:
        t["state"], t["scale"] = quantize(states["state"])
    return t


def nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype) -> int:
    """y read and written and the gate read; the final states read (in the scan's dtype) and
    written (with an int8 state's fp32 scales)."""
    norm = batch * PROMPT_TOKENS * shape.inner * 3 * harness.ACT.itemsize
    elements = batch * shape.inner * shape.d_state
    if state_dtype == torch.int8:
        return norm + elements * (4 + 1) + batch * shape.inner * 4
    return norm + 2 * elements * state_dtype.itemsize


def ours(t: dict, shape: MambaShape) -> Callable[[], object]:
    return lambda: mamba2_prefill_tail(
        t["x"], t["z"], t["weight"], shape.group_size, EPS, t["state"], t["slots"], t["values"],
        t["scale"],
    )  # fmt: skip


def separate(t: dict, shape: MambaShape) -> Callable[[], object]:
    def call() -> None:
        group_rms_norm(t["x"], t["weight"], shape.group_size, EPS, z=t["z"], out=t["x"])
        if t["scale"] is None:
            scatter_state_slots(t["state"], t["slots"], t["values"])
            return
        q, scale = quantize(t["values"])
        scatter_state_slots(t["state"], t["slots"], q)
        scatter_state_slots(t["scale"], t["slots"], scale)

    return call


def vllm(t: dict, shape: MambaShape) -> Callable[[], object]:
    from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated

    def call() -> None:
        rms_norm_gated(
            t["x"], t["weight"], None, z=t["z"], eps=EPS, group_size=shape.group_size,
            norm_before_gate=False,
        )  # fmt: skip
        t["state"][t["slots"]] = t["values"]

    return call


def eager_us(make_call: Callable[[], Callable[[], object]]) -> float:
    """Wall microseconds per call of calls launched back to back, no graph (the median of 5
    loops)."""
    call = make_call()
    call()
    loops = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(EAGER_CALLS):
            call()
        torch.cuda.synchronize()
        loops.append((time.perf_counter() - t0) * 1e6 / EAGER_CALLS)
    return sorted(loops)[2]


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for sdt in state_dtypes:
        alternatives = [("mamba2_prefill_tail_vs_separate", separate)]
        if sdt != torch.int8:
            alternatives.insert(0, ("mamba2_prefill_tail", vllm))
        for batch in batches:
            nb = nbytes(shape, batch, sdt)

            def make(fn):
                return lambda: fn(inputs(shape, batch, sdt), shape)

            us_ours = harness.time_rotating(make(ours), nb)
            eager_ours = eager_us(make(ours))
            for kernel, theirs in alternatives:
                bench.record(
                    kernel, model, harness.dtype_name(sdt), batch, us_ours,
                    harness.time_rotating(make(theirs), nb), nb, nb,
                    ours_eager_us=round(eager_ours, 2),
                    other_eager_us=round(eager_us(make(theirs)), 2),
                )  # fmt: skip


if __name__ == "__main__":
    ap = harness.parser(__doc__, ("float32", "bfloat16", "int8"))
    harness.run([compare], "kernels-mamba2_prefill_tail", ap.parse_args())
