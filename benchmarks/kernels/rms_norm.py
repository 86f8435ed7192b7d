"""The gated group RMSNorm of a Mamba layer's output against vLLM's, on the GPU.

    python benchmarks/kernels/rms_norm.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-rms_norm-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness

from vllm_nemotron_h.ops import group_rms_norm
from vllm_nemotron_h.testing.op_inputs import MambaShape, group_norm_inputs

EPS = 1e-5


def inputs(shape: MambaShape, batch: int) -> dict:
    return group_norm_inputs(harness.draw(), shape, batch, harness.ACT)


def nbytes(shape: MambaShape, batch: int, gate: bool) -> int:
    """y (and the gate) read, out written."""
    return batch * shape.inner * (3 if gate else 2) * harness.ACT.itemsize


def ours(t: dict, shape: MambaShape, gate: bool) -> Callable[[], object]:
    z = t["z"] if gate else None
    return lambda: group_rms_norm(t["x"], t["weight"], shape.group_size, EPS, z=z)


def vllm(t: dict, shape: MambaShape) -> Callable[[], object]:
    from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated

    return lambda: rms_norm_gated(
        t["x"], t["weight"], None, z=t["z"], eps=EPS, group_size=shape.group_size,
        norm_before_gate=False,
    )  # fmt: skip


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for batch in batches:
        nb = nbytes(shape, batch, True)
        bench.record(
            "group_rms_norm_gated", model, "-", batch,
            harness.time_rotating(lambda: ours(inputs(shape, batch), shape, True), nb),
            harness.time_rotating(lambda: vllm(inputs(shape, batch), shape), nb),
            nb, nb,
        )  # fmt: skip


if __name__ == "__main__":
    harness.run([compare], "kernels-rms_norm", harness.parser(__doc__).parse_args())
