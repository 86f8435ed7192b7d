"""Host time of the ops' argument checks, per call, on this machine's CPU (timeit): what a
step would pay if the per-step calls checked their arguments, which the decode plan does once
per layer instead. Inputs at a real model's layer shape, laid out as the engine passes them.

    python benchmarks/argument_check_cost.py [--model nemotron-h-8b] [--batch 8]

Writes benchmarks/results/argument-check-cost-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import timeit
from pathlib import Path

import torch

from vllm_nemotron_h.ops.mamba2_decode import interface as decode_op
from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.interface import check_group
from vllm_nemotron_h.ops.state_slot_copy.interface import check_gather, check_scatter
from vllm_nemotron_h.testing.op_inputs import Draw, LayerCase, MambaShape, record_of

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--batch", type=int, default=8, help="rows; half of them prefill rows")
    ap.add_argument("--output", type=Path, default=RESULTS / "argument-check-cost-cpu.json")
    args = ap.parse_args()
    shape = MambaShape.of_model(args.model)
    act = torch.bfloat16
    t = LayerCase(Draw.seeded(0, "cpu"), shape, args.batch, act, act).decode()
    state, slots = t["ssm_state"], t["state_slots"]
    prefill = args.batch // 2
    has_initial = torch.ones(prefill, dtype=torch.bool)
    final_states = state[:prefill].clone()
    y = torch.empty(args.batch, shape.inner, dtype=act)
    out = torch.empty(args.batch, shape.inner, dtype=act)

    def gather():
        check_gather(state, slots[:prefill], has_initial)

    def scatter():
        check_scatter(state, slots[:prefill], final_states)

    def group_norm():
        check_group(y, GroupNorm(t["norm_weight"], shape.group_size), t["z"], y)

    layer = record_of(DecodeLayer, t)
    step = record_of(DecodeStep, t, out=out)

    def decode_tail():
        decode_op.check(layer, step)

    rows = {}
    for name, f in (
        ("gather_state_slots", gather),
        ("scatter_state_slots", scatter),
        ("group_rms_norm", group_norm),
        ("mamba2_decode", decode_tail),
    ):
        n = 20000
        us = min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6
        rows[name] = round(us, 2)
        print(f"{name:22s} {us:6.2f} us per call", flush=True)
    meta = dict(
        model=args.model,
        batch=args.batch,
        cpu=platform.processor() or platform.machine(),
        torch=torch.__version__,
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d"),
    )
    args.output.write_text(json.dumps(dict(meta=meta, us_per_call=rows), indent=1))
    print("wrote", args.output)


if __name__ == "__main__":
    main()
