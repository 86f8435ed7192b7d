"""The state update (one decode step of the SSM state) against vLLM's, on the GPU. An int8
state (--state-dtypes int8) is compared with vLLM's kernel on a bf16 state (its narrowest
format) and with the plugin's bf16 state (``ours_bf16_us``).

Without vLLM installed (a GPU host before its kit) the vLLM columns stay empty. When vLLM
0.32's kernels are importable as ``v32ops`` (../shared/anchors/
extract_vllm032_ops.py writes them; put their folder on PYTHONPATH), each row also times
vLLM 0.32's plain kernel (``v32_us``) and its ReplaySSM output-only kernel amortised over its
window of L = 16 steps (``replay_us`` = (15 x a step that only reads the state + 1 x the flush
step that writes it) / 16; the reading steps' ring positions spread over 0..14). int8 rows
carry ReplaySSM on an fp32 and on a bf16 state (``replay_fp32_us``, ``replay_bf16_us``).

    python benchmarks/kernels/selective_state_update.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-selective_state_update-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch

from vllm_nemotron_h.ops import selective_state_update
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype, gate: bool = True) -> dict:
    """The engine's layout, every row a live sequence, and an output buffer."""
    t = LayerCase(harness.draw(), shape, batch, state_dtype, harness.ACT, 1, None).ssu(gate)
    t["out"] = torch.empty_like(t["x"])
    return t


def nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype, gate: bool) -> int:
    """The state (and an int8 state's fp32 scales) read and written; x, (z), out, B, C and dt
    of each row."""
    s, act = shape, harness.ACT.itemsize
    scales = 2 * s.nheads * s.head_dim * 4 if state_dtype == torch.int8 else 0
    return batch * (
        2 * s.nheads * s.head_dim * s.d_state * state_dtype.itemsize
        + scales
        + (3 if gate else 2) * s.inner * act
        + 2 * s.ngroups * s.d_state * act
        + s.nheads * act
    )


def ours(t: dict, config: tuple[int, int] | None = None) -> Callable[[], object]:
    return lambda: selective_state_update(**t, null_slot=0, config=config)


def vllm(t: dict, shape: MambaShape) -> Callable[[], object]:
    """The installed vLLM's kernel (0.26 on the GPU host), called as its Mamba2 layer calls it."""
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update as v

    a = broadcast(t, shape)
    return lambda: v(
        t["state"], t["x"], a["dt"], a["A"], t["B"], t["C"], a["D"], a["dt_bias"], z=t["z"],
        dt_softplus=True, state_batch_indices=a["slots"], out=t["out"],
    )  # fmt: skip


def vllm032_available() -> bool:
    try:
        import v32ops.mamba_ssm  # noqa: F401
    except ImportError:
        print("v32ops not importable: no vLLM 0.32 columns", flush=True)
        return False
    return True


def v32(t: dict, shape: MambaShape) -> Callable[[], object]:
    """vLLM 0.32's plain kernel, called as vLLM's own (per-head parameters broadcast)."""
    from v32ops.mamba_ssm import selective_state_update as v

    a = broadcast(t, shape)
    return lambda: v(
        t["state"], t["x"], a["dt"], a["A"], t["B"], t["C"], a["D"], a["dt_bias"], z=t["z"],
        dt_softplus=True, state_batch_indices=a["slots"], null_block_id=0, out=t["out"],
    )  # fmt: skip


REPLAY_WINDOW = 16


def replay(t: dict, shape: MambaShape, flush: bool) -> Callable[[], object]:
    """One step of vLLM 0.32's ReplaySSM output-only kernel with its rings (x, dt, B per slot
    and window position) filled: a flush step (every row at the window's end, the state
    rebuilt and written) or a reading step (row b at position (b + 7) % 15, state read only)."""
    from v32ops.selective_state_update_replayssm_output_only import (
        selective_state_update_replayssm_output_only as v,
    )

    s, L = shape, REPLAY_WINDOW
    slots, batch, dev = t["state"].shape[0], t["x"].shape[0], t["x"].device
    draw = harness.draw()
    act = t["x"].dtype
    pos = torch.arange(batch, device=dev, dtype=torch.int32)
    write_pos = torch.full_like(pos, L - 1) if flush else (pos + 7) % (L - 1)
    a = broadcast(t, shape)
    rings = dict(
        x_cache=draw.normal(slots, s.nheads, L, s.head_dim, dtype=act),
        dt_cache=draw.normal(slots, s.nheads, L, dtype=torch.float32).abs() * 0.1,
        B_cache=draw.normal(slots, s.ngroups, L, s.d_state, dtype=act),
        bc_pre=torch.zeros(batch, s.ngroups, L, device=dev),
    )
    return lambda: v(
        t["state"], t["x"], a["dt"], a["A"], t["B"], t["C"], a["D"], a["dt_bias"], z=t["z"],
        dt_softplus=True, **rings, write_pos=write_pos,
        is_flush=torch.full((batch,), flush, device=dev), max_cache_len=L,
        state_batch_indices=a["slots"], null_block_id=0, out=t["out"],
    )  # fmt: skip


def broadcast(t: dict, shape: MambaShape) -> dict:
    """The per-head parameters broadcast over head_dim (and d_state for A) as vLLM's Mamba2
    layer passes them; int32 slots."""
    P, N = shape.head_dim, shape.d_state
    return dict(
        A=t["A"][:, None, None].expand(-1, P, N),
        dt=t["dt"][:, :, None].expand(-1, -1, P),
        D=t["D"][:, None].expand(-1, P),
        dt_bias=t["dt_bias"][:, None].expand(-1, P),
        slots=t["state_slots"].to(torch.int32),
    )


def vllm032_columns(shape: MambaShape, batch: int, sdt: torch.dtype, prefix: str = "") -> dict:
    """v32_us and replay_us (amortised) of vLLM 0.32's kernels on a ``sdt`` state."""
    nb = nbytes(shape, batch, sdt, True)

    def timed(make) -> float:
        return harness.time_rotating(lambda: make(inputs(shape, batch, sdt)), nb)

    reading = timed(lambda t: replay(t, shape, flush=False))
    flushing = timed(lambda t: replay(t, shape, flush=True))
    amortised = ((REPLAY_WINDOW - 1) * reading + flushing) / REPLAY_WINDOW
    cols = {f"replay{prefix}_us": round(amortised, 3)}
    if not prefix:
        cols["v32_us"] = round(timed(lambda t: v32(t, shape)), 3)
    return cols


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    with_v32 = vllm032_available()
    for sdt in state_dtypes:
        for batch in batches:
            nb = nbytes(shape, batch, sdt, True)
            if sdt == torch.int8:
                compare_int8(bench, model, shape, batch, with_v32)
                continue
            theirs = lambda: vllm(inputs(shape, batch, sdt), shape)  # noqa: E731
            bench.record(
                "selective_state_update", model, harness.dtype_name(sdt), batch,
                harness.time_rotating(lambda: ours(inputs(shape, batch, sdt)), nb),
                harness.time_if_installed("vllm", theirs, nb),
                nb, nb, **(vllm032_columns(shape, batch, sdt) if with_v32 else {}),
            )  # fmt: skip


def compare_int8(
    bench: harness.Comparison, model: str, shape: MambaShape, batch: int, with_v32: bool
) -> None:
    """The int8 state against vLLM's kernel and the plugin's, both on a bf16 state, and
    vLLM 0.32's ReplaySSM on an fp32 and a bf16 state."""
    bf16 = torch.bfloat16
    nb, nb_bf16 = nbytes(shape, batch, torch.int8, True), nbytes(shape, batch, bf16, True)
    ours_bf16 = harness.time_rotating(lambda: ours(inputs(shape, batch, bf16)), nb_bf16)
    v32 = {}
    if with_v32:
        v32 = {
            **vllm032_columns(shape, batch, torch.float32, "_fp32"),
            **vllm032_columns(shape, batch, bf16, "_bf16"),
        }
    bench.record(
        "selective_state_update", model, "int8", batch,
        harness.time_rotating(lambda: ours(inputs(shape, batch, torch.int8)), nb),
        harness.time_if_installed("vllm", lambda: vllm(inputs(shape, batch, bf16), shape), nb_bf16),
        nb, nb_bf16, ours_bf16_us=round(ours_bf16, 3), **v32,
    )  # fmt: skip


if __name__ == "__main__":
    args = harness.parser(__doc__, (*harness.STATE_DTYPES, "int8")).parse_args()
    harness.run([compare], "kernels-selective_state_update", args)
