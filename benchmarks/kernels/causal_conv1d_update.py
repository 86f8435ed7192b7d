"""The conv update (one decode step of the conv window) against vLLM's, on the GPU.

    python benchmarks/kernels/causal_conv1d_update.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-causal_conv1d_update-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch

from vllm_nemotron_h.ops import causal_conv1d_update
from vllm_nemotron_h.testing.op_inputs import MambaShape, conv_inputs


def conv_state_dim_first() -> bool:
    """vLLM's conv-state layout of this version (dim-first, or "SD" seen transposed)."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return is_conv_state_dim_first()


def inputs(shape: MambaShape, batch: int) -> dict:
    t = conv_inputs(
        harness.draw(), shape.conv_dim, shape.width, batch, harness.ACT,
        dim_first=conv_state_dim_first(), spare_slots=1, null_row=None,
    )  # fmt: skip
    t["out"] = torch.empty(t["x"].shape, dtype=harness.ACT, device="cuda")
    return t


def nbytes(shape: MambaShape, batch: int) -> int:
    """The window read and written, x read and out written per row; the weights and bias."""
    window, act = shape.width - 1, harness.ACT.itemsize
    return (
        batch * shape.conv_dim * (2 * window + 2) * act + shape.conv_dim * (shape.width + 1) * act
    )


def ours(t: dict, config: tuple[int, int] | None = None) -> Callable[[], object]:
    return lambda: causal_conv1d_update(**t, activation="silu", null_slot=0, config=config)


def vllm(t: dict) -> Callable[[], object]:
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update as v

    slots = t["state_slots"].to(torch.int32)
    return lambda: v(
        t["x"], t["conv_state"], t["weight"], t["bias"], "silu", conv_state_indices=slots
    )


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for batch in batches:
        nb = nbytes(shape, batch)
        bench.record(
            "causal_conv1d_update", model, "-", batch,
            harness.time_rotating(lambda: ours(inputs(shape, batch)), nb),
            harness.time_rotating(lambda: vllm(inputs(shape, batch)), nb),
            nb, nb,
        )  # fmt: skip


if __name__ == "__main__":
    harness.run([compare], "kernels-causal_conv1d_update", harness.parser(__doc__).parse_args())
