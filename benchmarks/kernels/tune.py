"""Launch-config sweeps of the state update (BLOCK_M, num_warps, tiles per program), the
fused decode tail (BLOCK_M, num_warps) and the conv update (BLOCK_D, num_warps) per shape,
state dtype and batch, on the GPU; and the per-device launch tables derived from a sweep.

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

from vllm_nemotron_h.ops import launch_config
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


def tuned_tables(rows: list, open_ended: bool = True) -> dict:
    """The launch tables of the swept kernels from a sweep: at each measured point (batch x
    heads for the state update, batch x channels for the conv update) the config with the
    smallest mean time relative to the point's best (shapes that share a key and a point are
    averaged); a config applies up to its point, consecutive equal ones merged, the last one
    open-ended (None), laid out as the device files of vllm_nemotron_h/ops/configs. A sweep
    of one rank's shapes (``tensor_parallel_size``) measures smaller points of the same keys
    (a TP=4 rank of the 8B at B=1: 32 heads); without ``open_ended`` the last row keeps its
    point (rows to put in front of a table's)."""
    points: dict = {}
    for r in rows:
        shape = MambaShape.of_model(r["model"], r.get("tensor_parallel_size", 1))
        if r["kernel"] in ("selective_state_update", "deferred_state_update", "mamba2_decode"):
            state_bytes = getattr(torch, r["state_dtype"]).itemsize
            key = (r["kernel"], shape.head_dim, shape.d_state, state_bytes)
            point = r["batch"] * shape.nheads
        else:
            key, point = "causal_conv1d_update", r["batch"] * shape.conv_dim
        cell = points.setdefault(key, {}).setdefault(point, {}).setdefault(r["model"], {})
        cell[tuple(r["config"])] = r["us"]
    tables = {}
    for key, by_point in points.items():
        table: list = []
        for point in sorted(by_point):
            runs = by_point[point].values()  # one {config: us} per shape measured here
            common = set.intersection(*(set(run) for run in runs))
            best = min(
                common, key=lambda c: sum(run[c] / min(run.values()) for run in runs) / len(runs)
            )
            best = best[:2] if best[2:] == (1,) else best  # one tile a program: the default
            if table and table[-1][1:] == best:
                table.pop()
            table.append((point, *best))
        rows_ = [list(row) for row in table]
        if open_ended:
            rows_[-1][0] = None
        if key == "causal_conv1d_update":
            tables[key] = rows_
        else:
            tables.setdefault(key[0], {})[",".join(map(str, key[1:]))] = rows_
    return tables


def write_tables(device_name: str, tables: dict, how: str, in_front: bool = False) -> Path:
    """Writes ``tables`` into ``device_name``'s file: the keys a sweep measured replace
    theirs, the device's other tables and keys stay (a sweep of one kernel or one format
    leaves the rest of the file as it was), and ``how`` says which is which. With
    ``in_front`` (tables of points below the file's, ``open_ended`` False) a key's rows go
    in front of the file's rows of larger points instead of replacing them."""
    path = launch_config.device_file(device_name)
    if not path.exists():
        return launch_config.write_device_file(device_name, tables, how)
    old = json.loads(path.read_text())
    merged = {name: table for name, table in old.items() if name not in ("device", "how")}
    swept = []  # "kernel key" per keyed table, "kernel" per list
    for name, table in tables.items():
        keyed = isinstance(table, dict) and isinstance(merged.get(name), dict)
        if keyed and in_front:
            table = {
                key: in_front_of(rows, merged[name].get(key), key) for key, rows in table.items()
            }
        merged[name] = {**merged[name], **table} if keyed else table
        swept += [f"{name} {key}" for key in table] if isinstance(table, dict) else [name]
    if merged != tables:  # the file keeps rows the sweep did not measure
        how = f"{old['how']}; then {', '.join(swept)} {how}"
    return launch_config.write_device_file(device_name, merged, how)


def in_front_of(rows: list, old: list | None, key: str) -> list:
    """``rows`` (smaller points, the last one closed) in front of ``old``'s rows of larger
    points. Without ``old`` (no rows for ``key``, "head_dim,d_state,state bytes") past the
    sweep's largest point the kernel keeps its untuned config, which a sweep of one rank's
    B=1 and 2 says nothing against."""
    if old is None:
        _, d_state, state_bytes = (int(v) for v in key.split(","))
        old = [[None, *launch_config.untuned_plane_tile(d_state, state_bytes)]]
    larger = [row for row in old if row[0] is None or row[0] > rows[-1][0]]
    if larger and larger[0][1:] == rows[-1][1:]:  # the same config: one row
        rows = rows[:-1]
    return rows + larger


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
