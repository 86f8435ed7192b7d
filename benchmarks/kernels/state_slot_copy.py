"""A prefill's state copies through the rows' slots (gather of the initial states, scatter of
the final states) against the PyTorch indexing vLLM's Mamba2 layer does, on the GPU; for an
int8 state, the gather that dequantizes in one pass against two gathers (values, scales) and
PyTorch's dequantize (column ``separate_us``).

    python benchmarks/kernels/state_slot_copy.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-state_slot_copy-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch

from vllm_nemotron_h.ops import gather_state_slots, scatter_state_slots
from vllm_nemotron_h.ops.state_format import dequantize
from vllm_nemotron_h.ops.support import STATE_DTYPES
from vllm_nemotron_h.testing.op_inputs import MambaShape, slot_copy_inputs


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype) -> dict:
    per_slot = (shape.nheads, shape.head_dim, shape.d_state)
    draw = harness.draw()
    t = slot_copy_inputs(draw, per_slot, batch, state_dtype)
    if state_dtype == torch.int8:
        t["scale"] = draw.normal(t["state"].shape[0], *per_slot[:-1]).abs()
    return t


def nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype) -> int:
    return 2 * batch * shape.nheads * shape.head_dim * shape.d_state * state_dtype.itemsize


def ours_scatter(t: dict) -> Callable[[], object]:
    return lambda: scatter_state_slots(t["state"], t["slots"], t["values"])


def ours_gather(t: dict) -> Callable[[], object]:
    return lambda: gather_state_slots(t["state"], t["slots"], t["has_initial"])


def int8_gather_nbytes(shape: MambaShape, batch: int) -> int:
    """int8 values and fp32 scales read, fp32 values written."""
    rows = batch * shape.nheads * shape.head_dim
    return rows * shape.d_state * (1 + 4) + rows * 4


def ours_int8_gather(t: dict) -> Callable[[], object]:
    return lambda: gather_state_slots(t["state"], t["slots"], t["has_initial"], t["scale"])


def separate_int8_gather(t: dict) -> Callable[[], object]:
    def run() -> torch.Tensor:
        q = gather_state_slots(t["state"], t["slots"], t["has_initial"])
        return dequantize(q, gather_state_slots(t["scale"], t["slots"], t["has_initial"]))

    return run


def vllm_scatter(t: dict) -> Callable[[], object]:
    return lambda: t["state"].__setitem__(t["slots"], t["values"])


def vllm_gather(t: dict) -> Callable[[], object]:
    flags = t["has_initial"][:, None, None, None]
    return lambda: torch.where(flags, t["state"][t["slots"]], 0)


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for sdt in state_dtypes:
        if sdt == torch.int8:  # no int8 state in vLLM: against the plugin's separate steps
            for batch in batches:
                nb = int8_gather_nbytes(shape, batch)
                t_ours = harness.time_rotating(
                    lambda: ours_int8_gather(inputs(shape, batch, sdt)), nb
                )
                t_sep = harness.time_rotating(
                    lambda: separate_int8_gather(inputs(shape, batch, sdt)), nb
                )
                bench.record(
                    "gather_state_slots", model, "int8", batch, t_ours, None, nb, nb,
                    separate_us=t_sep,
                )  # fmt: skip
            continue
        if sdt not in STATE_DTYPES:
            continue
        for batch in batches:
            nb = nbytes(shape, batch, sdt)
            for kernel, ours, theirs in (
                ("scatter_state_slots", ours_scatter, vllm_scatter),
                ("gather_state_slots", ours_gather, vllm_gather),
            ):
                us_ours = harness.time_rotating(lambda: ours(inputs(shape, batch, sdt)), nb)
                us_vllm = harness.time_rotating(lambda: theirs(inputs(shape, batch, sdt)), nb)
                bench.record(
                    kernel, model, harness.dtype_name(sdt), batch, us_ours, us_vllm, nb, nb
                )


if __name__ == "__main__":
    harness.run([compare], "kernels-state_slot_copy", harness.parser(__doc__).parse_args())
