"""The per-device launch tables derived from a tune.py sweep (the rows vllm_nemotron_h/ops/
configs holds), and their writing into a device's file: used by tune.py --tables and by any
kernel benchmark's --use-tables (harness.tables_of)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vllm_nemotron_h.ops import launch_config
from vllm_nemotron_h.ops.causal_conv1d_update import interface as conv_update
from vllm_nemotron_h.testing.op_inputs import MambaShape


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
                key: in_front_of(rows, merged[name].get(key), untuned_config(name, key))
                for key, rows in table.items()
            }
        elif in_front:  # the conv update's one list of rows
            table = in_front_of(table, merged.get(name), untuned_config(name))
        merged[name] = {**merged[name], **table} if keyed else table
        swept += [f"{name} {key}" for key in table] if isinstance(table, dict) else [name]
    if merged != tables:  # the file keeps rows the sweep did not measure
        how = f"{old['how']}; then {', '.join(swept)} {how}"
    return launch_config.write_device_file(device_name, merged, how)


def untuned_config(kernel: str, key: str | None = None) -> tuple[int, ...]:
    """The config ``kernel`` launches where its table has no row: the conv update's default,
    a state kernel's untuned plane tile for ``key`` ("head_dim,d_state,state bytes")."""
    if kernel == "causal_conv1d_update":
        return conv_update.DEFAULT_CONFIG
    _, d_state, state_bytes = (int(v) for v in key.split(","))
    return launch_config.untuned_plane_tile(d_state, state_bytes)


def in_front_of(rows: list, old: list | None, untuned: tuple[int, ...]) -> list:
    """``rows`` (smaller points, the last one closed) in front of ``old``'s rows of larger
    points. Without ``old`` (the file has no rows for this table) past the sweep's largest
    point the kernel keeps its ``untuned`` config, which a sweep of one rank's B=1 and 2 says
    nothing against."""
    if old is None:
        old = [[None, *untuned]]
    larger = [row for row in old if row[0] is None or row[0] > rows[-1][0]]
    if larger and larger[0][1:] == rows[-1][1:]:  # the same config: one row
        rows = rows[:-1]
    return rows + larger
