"""The state update (one decode step of the SSM state) against vLLM's, on the GPU. An int8
state (--state-dtypes int8) is compared with vLLM's kernel on a bf16 state (its narrowest
format) and with the plugin's bf16 state (``ours_bf16_us``).

    python benchmarks/kernels/selective_state_update.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-selective_state_update-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch

from vllm_nemotron_h.ops import selective_state_update
from vllm_nemotron_h.testing.op_inputs import MambaShape, ssu_inputs


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype, gate: bool = True) -> dict:
    """The engine's layout, every row a live sequence, and an output buffer."""
    t = ssu_inputs(
        harness.draw(), shape, batch, state_dtype, harness.ACT, gate=gate, spare_slots=1,
        null_row=None,
    )  # fmt: skip
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
    """vLLM's kernel, with the per-head parameters broadcast over head_dim and d_state as its
    Mamba2 layer passes them."""
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update as v

    P, N = shape.head_dim, shape.d_state
    A = t["A"][:, None, None].expand(-1, P, N)
    dt = t["dt"][:, :, None].expand(-1, -1, P)
    D, dt_bias = t["D"][:, None].expand(-1, P), t["dt_bias"][:, None].expand(-1, P)
    slots = t["state_slots"].to(torch.int32)
    return lambda: v(
        t["state"], t["x"], dt, A, t["B"], t["C"], D, dt_bias, z=t["z"], dt_softplus=True,
        state_batch_indices=slots, out=t["out"],
    )  # fmt: skip


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for sdt in state_dtypes:
        for batch in batches:
            nb = nbytes(shape, batch, sdt, True)
            if sdt == torch.int8:
                compare_int8(bench, model, shape, batch)
                continue
            bench.record(
                "selective_state_update", model, harness.dtype_name(sdt), batch,
                harness.time_rotating(lambda: ours(inputs(shape, batch, sdt)), nb),
                harness.time_rotating(lambda: vllm(inputs(shape, batch, sdt), shape), nb),
                nb, nb,
            )  # fmt: skip


def compare_int8(bench: harness.Comparison, model: str, shape: MambaShape, batch: int) -> None:
    """The int8 state against vLLM's kernel and the plugin's, both on a bf16 state."""
    bf16 = torch.bfloat16
    nb, nb_bf16 = nbytes(shape, batch, torch.int8, True), nbytes(shape, batch, bf16, True)
    ours_bf16 = harness.time_rotating(lambda: ours(inputs(shape, batch, bf16)), nb_bf16)
    bench.record(
        "selective_state_update", model, "int8", batch,
        harness.time_rotating(lambda: ours(inputs(shape, batch, torch.int8)), nb),
        harness.time_rotating(lambda: vllm(inputs(shape, batch, bf16), shape), nb_bf16),
        nb, nb_bf16, ours_bf16_us=round(ours_bf16, 3),
    )  # fmt: skip


if __name__ == "__main__":
    args = harness.parser(__doc__, (*harness.STATE_DTYPES, "int8")).parse_args()
    harness.run([compare], "kernels-selective_state_update", args)
