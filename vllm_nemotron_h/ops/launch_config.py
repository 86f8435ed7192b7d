"""Tuned launch configurations: per-device data in configs/<device name>.json, one resolver.

A state update cannot be autotuned on the live state (each trial would advance it), so the
tables are tuned offline on copies (benchmarks/kernels/tune.py) and shipped per GPU, as vLLM
ships its fused-MoE configs. The file is chosen by the CUDA device's name with spaces as
underscores (``NVIDIA_H100_80GB_HBM3.json``); a device without a file, and CPU, get the
defaults of each op. Benchmarks replace a table for a while with ``overridden``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import triton

CONFIGS_DIR = Path(__file__).parent / "configs"
# Rows of a table: [max batch x heads (or x channels) or None for no limit, tile, num_warps]; a
# state update's rows may add how many tiles one program advances (1 if absent); a choice's
# rows (deferred_state_update_pays) hold [max batch x heads or None, 1 or 0].
Rows = list[list[int | None]]

_overrides: dict[str, Any] = {}


def device_file(device_name: str) -> Path:
    return CONFIGS_DIR / (device_name.replace(" ", "_") + ".json")


@functools.cache
def _device_tables(device_index: int) -> dict[str, Any]:
    path = device_file(torch.cuda.get_device_name(device_index))
    return json.loads(path.read_text()) if path.exists() else {}


def table(name: str, device: torch.device) -> Any:
    """The entry ``name`` of ``device``'s tables (an override first), or None."""
    if name in _overrides:
        return _overrides[name]
    if device.type != "cuda":
        return None
    return _device_tables(device.index if device.index is not None else 0).get(name)


@contextlib.contextmanager
def overridden(name: str, value: Any) -> Iterator[None]:
    """Replaces the entry ``name`` of every device's tables while the block runs (benchmarks
    sweeping configs). Cached configs of the ops are cleared on entry and exit."""
    had, old = name in _overrides, _overrides.get(name)
    _overrides[name] = value
    clear_caches()
    try:
        yield
    finally:
        if had:
            _overrides[name] = old
        else:
            del _overrides[name]
        clear_caches()


_caches: list[Any] = []


def cached(fn: Any) -> Any:
    """functools.cache for a config function, cleared when a table is overridden (eager and
    mixed steps resolve a config per Mamba layer; CUDA-graph replays resolve none)."""
    wrapped = functools.cache(fn)
    _caches.append(wrapped)
    return wrapped


def clear_caches() -> None:
    for fn in _caches:
        fn.cache_clear()


def first_fit(rows: Rows | None, size: int) -> tuple[int, ...] | None:
    """The config (tile, num_warps[, tiles]) of the first row whose limit admits ``size``."""
    for limit, *config in rows or []:
        if limit is None or size <= limit:
            return tuple(config)
    return None


def largest_tile(block_m: int, group_rows: int) -> int:
    """The largest power of two <= ``block_m`` dividing ``group_rows``: a tile of the
    (head, row) plane never spans two groups."""
    while group_rows % block_m:
        block_m //= 2
    return block_m


def state_rows(
    name: str, device: torch.device, head_dim: int, d_state: int, state_dtype: torch.dtype
) -> Rows | None:
    """The rows of a state kernel's table ``name`` for a state shape and format, keyed by
    "head_dim,d_state,state bytes", or None."""
    return (table(name, device) or {}).get(f"{head_dim},{d_state},{state_dtype.itemsize}")


def untuned_plane_tile(d_state: int, state_bytes: int) -> tuple[int, int]:
    """(BLOCK_M, num_warps) of a state kernel where its table has no row: about 8 KB of state
    per program (bytes in flight per SM, and enough programs)."""
    block_n = triton.next_power_of_2(d_state)
    return max(4, min(64, 8192 // (block_n * state_bytes))), 4


@cached
def plane_tile_config(
    name: str,
    device: torch.device,
    head_dim: int,
    d_state: int,
    state_dtype: torch.dtype,
    batch_heads: int,
    group_rows: int,
) -> tuple[int, int, int]:
    """(BLOCK_M, num_warps, tiles per program) of a kernel tiling the (head, row) plane of
    the state, from the table ``name`` keyed by "head_dim,d_state,state bytes"; untuned
    shapes take ``untuned_plane_tile``, one tile each. A program's rows never span two
    groups."""
    rows = state_rows(name, device, head_dim, d_state, state_dtype)
    block_m, warps, *more = first_fit(rows, batch_heads) or untuned_plane_tile(
        d_state, state_dtype.itemsize
    )
    block_m = largest_tile(block_m, group_rows)
    tiles = more[0] if more else 1
    while group_rows % (block_m * tiles):
        tiles -= 1
    return block_m, warps, tiles


def write_device_file(device_name: str, tables: dict[str, Any], how: str) -> Path:
    """Writes ``tables`` as ``device_name``'s file (benchmarks/kernels/tune.py), a row per line."""
    path = device_file(device_name)
    text = json.dumps({"device": device_name, "how": how, **tables}, indent=1)
    text = re.sub(
        r"\[\s+(null|\d+),\s+(\d+)(?:,\s+(\d+))?(?:,\s+(\d+))?\s+\]",
        lambda m: "[" + ", ".join(v for v in m.groups() if v is not None) + "]",
        text,
    )
    path.write_text(text + "\n")
    return path
