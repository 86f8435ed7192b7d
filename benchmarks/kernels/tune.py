"""Launch-config sweeps of the state update (BLOCK_M, num_warps, tiles per program), the
fused decode tail (BLOCK_M, num_warps) and the conv update (BLOCK_D, num_warps) per shape,
state dtype and batch, on the GPU; and, with --tables, the per-device launch tables derived
from a sweep (sweep_tables.py).

    python benchmarks/kernels/tune.py [--kernels K,..] [--quick]      # writes the sweep
    python benchmarks/kernels/tune.py --tables SWEEP [--write DEVICE] # prints / writes tables

The sweep goes to benchmarks/results/kernel-tuning-<gpu>.json (or --output); a comparison
with its tables in place: any kernel benchmark with --use-tables SWEEP.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
from sweep_tables import tuned_tables, write_tables

from vllm_nemotron_h.testing.op_inputs import MambaShape

TUNABLE = (
    "selective_state_update",
    "deferred_state_update",
    "causal_conv1d_update",
    "mamba2_decode",
)
FUSED_TUNE_MAX = 32  # the fused tail runs at small batches only (its device table's limit)
MAX_TILES = 10  # tiles per program swept at most (each adds a config per tile and warps)


def best_config(label: str, configs, make_call, nbytes: int, rows: list, out: Path, **key) -> None:
    """Times every config, appends one row per config, prints the winner and rewrites the
    sweep's JSON (a sweep cut short keeps what it measured)."""
    import harness

    timed = []
    for cfg in configs:
        us = harness.time_rotating(lambda: make_call(cfg), nbytes)
        rows.append(dict(key, config=list(cfg), us=us))
        timed.append((us, cfg))
    us, cfg = min(timed)
    print(f"tune {label} best {cfg} {us:8.2f}us", flush=True)
    out.write_text(json.dumps(rows, indent=1))


def programs_of_tiles(head_dim: int, tiles: list[int]) -> list[tuple[int, int, int]]:
    """State-update configs (BLOCK_M, num_warps, TILES) whose programs advance several tiles
    of one head, at 1 or 2 warps: the per-program work (B, C, a head's dt, A, D) is done once
    for TILES tiles, and the next tile loads while one is computed."""
    return [
        (bm, w, t)
        for bm in tiles
        for t in range(2, min(head_dim // bm, MAX_TILES) + 1)
        if head_dim % (bm * t) == 0
        for w in (1, 2)
    ]


def sweep(models, quick: bool, kernels, batches, state_dtypes, out: Path, tp: int = 1) -> list:
    import causal_conv1d_update as conv
    import deferred_state_update as dsu
    import harness
    import mamba2_decode as decode
    import selective_state_update as ssu

    rows: list = []
    warps = (2, 4, 8) if quick else (1, 2, 4, 8)
    for model in models:
        shape = MambaShape.of_model(model, tp)  # one rank's heads and groups
        group_rows = shape.nheads // shape.ngroups * shape.head_dim
        tiles = [bm for bm in (4, 8, 16, 32, 64, 128, 256) if group_rows % bm == 0]
        for kernel, sdt, batch in itertools.product(
            ("selective_state_update", "deferred_state_update", "mamba2_decode"),
            state_dtypes,
            batches,
        ):
            if kernel not in kernels or (kernel == "mamba2_decode" and batch > FUSED_TUNE_MAX):
                continue
            # Tiles up to 64 rows of an fp32 state's bytes (256 rows of int8); the fused tail
            # up to 128 rows whatever the state.
            max_rows = max(64 * 4 // sdt.itemsize, 128 if kernel == "mamba2_decode" else 0)
            cfgs = [(bm, w) for bm in tiles for w in warps if bm <= max_rows]
            if kernel == "deferred_state_update":  # a head per program, in tiles of rows
                cfgs = [
                    (bm, w) for bm in (16, 32, 64, 128) if bm < 2 * shape.head_dim for w in warps
                ]
                call = lambda cfg: dsu.ours(dsu.inputs(shape, batch, sdt), cfg)  # noqa: E731
                nbytes = int(dsu.nbytes(shape, batch, sdt))
            elif kernel == "selective_state_update":
                cfgs = [(bm, w, 1) for bm, w in cfgs] + programs_of_tiles(shape.head_dim, tiles)
                call = lambda cfg: ssu.ours(ssu.inputs(shape, batch, sdt), cfg)  # noqa: E731
                nbytes = ssu.nbytes(shape, batch, sdt, True)
            else:
                call = lambda cfg: decode.mamba2_decode_call(shape, batch, sdt, cfg)  # noqa: E731
                nbytes = decode.fused_nbytes(shape, batch, sdt)
            best_config(
                f"{kernel:22s} {model:12s} {harness.dtype_name(sdt):9s} B={batch:4d}",
                cfgs, call, nbytes, rows, out,
                kernel=kernel, model=model, state_dtype=harness.dtype_name(sdt), batch=batch,
                tensor_parallel_size=tp,
            )  # fmt: skip
        if "causal_conv1d_update" not in kernels:
            continue
        conv_cfgs = [(bd, w) for bd in (128, 256, 512, 1024) for w in warps]
        for batch in batches:
            best_config(
                f"causal_conv1d_update   {model:12s} B={batch:4d}",
                conv_cfgs,
                lambda cfg: conv.ours(conv.inputs(shape, batch), cfg),
                conv.nbytes(shape, batch),
                rows,
                out,
                kernel="causal_conv1d_update",
                model=model,
                batch=batch,
                tensor_parallel_size=tp,
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default=",".join(TUNABLE))
    ap.add_argument("--quick", action="store_true", help="2 and 4 warps only")
    ap.add_argument("--models", default=",".join(MambaShape.distinct_models()))
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--state-dtypes", default="float32,bfloat16")
    ap.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="sweep one rank's shapes at this TP"
    )
    ap.add_argument("--output", type=Path, help="sweep JSON (default kernel-tuning-<gpu>)")
    ap.add_argument("--tables", type=Path, help="print the launch tables of a sweep and exit")
    ap.add_argument("--write", metavar="DEVICE", help="with --tables: write DEVICE's file")
    ap.add_argument(
        "--in-front",
        action="store_true",
        help="with --write: the sweep's rows go in front of the file's (a TP sweep's points)",
    )
    args = ap.parse_args()
    if args.tables:
        tables = tuned_tables(json.loads(args.tables.read_text()), not args.in_front)
        print(json.dumps(tables, indent=1))
        if args.write:
            how = f"derived by benchmarks/kernels/tune.py --tables from {args.tables}"
            if args.in_front:
                how += " (smaller points: rows in front of the earlier ones)"
            print("wrote", write_tables(args.write, tables, how, args.in_front))
        return
    import harness

    print(f"copy roofline {harness.copy_roofline() / 1e9:.0f} GB/s", flush=True)
    out = args.output or harness.RESULTS / f"kernel-tuning-{harness.device_tag()}.json"
    sweep(
        args.models.split(","),
        args.quick,
        args.kernels.split(","),
        [int(b) for b in args.batches.split(",")],
        [getattr(torch, d) for d in args.state_dtypes.split(",")],
        out,
        args.tensor_parallel_size,
    )
    print("wrote", out)


if __name__ == "__main__":
    main()
