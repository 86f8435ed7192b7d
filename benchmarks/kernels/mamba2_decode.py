"""A Mamba layer's decode tail (conv update -> state update -> gated group norm) against
vLLM's three kernels, on the GPU: the plugin's three kernels in a row ("decode_tail"), the
fused kernel with the norm apart ("decode_tail_fused_conv") and all in one launch
("decode_tail_fused"), each against the same vLLM tail.

    python benchmarks/kernels/mamba2_decode.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-mamba2_decode-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import causal_conv1d_update as conv
import harness
import rms_norm as norm
import selective_state_update as ssu
import torch

from vllm_nemotron_h.ops import DecodeWorkspace, group_rms_norm, mamba2_decode
from vllm_nemotron_h.ops.support import STATE_DTYPES
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype) -> dict:
    """The engine's layout (xbc, z and dt views of one projection row), vLLM's conv-state
    layout, an output buffer and the fused launch's workspace."""
    case = LayerCase(harness.draw(), shape, batch, state_dtype, harness.ACT, 1, None)
    t = case.decode(dim_first=conv.conv_state_dim_first())
    t["out"] = torch.empty_like(t["z"], memory_format=torch.contiguous_format)
    t["workspace"] = DecodeWorkspace.allocate(batch, shape.nheads, shape.head_dim, "cuda")
    return t


def fused_nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype) -> int:
    """What the fused tail must move: both states (and an int8 state's fp32 scales) read and
    written, xbc, z, dt read, out written, the conv weights (intermediates stay on chip)."""
    s, act = shape, harness.ACT.itemsize
    window = s.width - 1
    scales = 2 * s.nheads * s.head_dim * 4 if state_dtype == torch.int8 else 0
    per_row = (
        2 * s.nheads * s.head_dim * s.d_state * state_dtype.itemsize
        + scales
        + s.conv_dim * (2 * window + 1) * act
        + 2 * s.inner * act
        + s.nheads * act
    )
    return batch * per_row + s.conv_dim * (s.width + 1) * act


def mamba2_decode_call(
    shape: MambaShape, batch: int, state_dtype: torch.dtype, config: tuple[int, int]
) -> Callable[[], object]:
    """The fused kernel with the norm at one launch config (the tuning sweep's call)."""
    t = inputs(shape, batch, state_dtype)
    return lambda: mamba2_decode(**t, null_slot=0, config=config, fuse=True)


def ours_fused(t: dict, shape: MambaShape, with_norm: bool) -> Callable[[], object]:
    """The fused kernel; without ``with_norm`` the group norm runs as its own kernel."""
    call = dict(t, norm_weight=t["norm_weight"] if with_norm else None, fuse=True)
    if with_norm:
        return lambda: mamba2_decode(**call, null_slot=0)
    return lambda: (
        mamba2_decode(**call, null_slot=0),
        group_rms_norm(t["out"], t["norm_weight"], shape.group_size, norm.EPS, out=t["out"]),
    )


def three_kernels(shape: MambaShape, batch: int, state_dtype: torch.dtype, ours: bool):
    """The conv, state update and norm benchmarks' calls in a row (ours ungated with the gate
    in the state update, vLLM's with the gate in its norm)."""
    c = conv.inputs(shape, batch)
    s = ssu.inputs(shape, batch, state_dtype, gate=ours)
    n = norm.inputs(shape, batch)
    if ours:
        steps = [conv.ours(c), ssu.ours(s), norm.ours(n, shape, False)]
    else:
        steps = [conv.vllm(c), ssu.vllm(s, shape), norm.vllm(n, shape)]
    return lambda: [f() for f in steps]


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for sdt in state_dtypes:
        if sdt not in STATE_DTYPES:  # int8: vLLM has no int8 state to compare with
            continue
        for batch in batches:
            name = harness.dtype_name(sdt)
            nb_ours = (
                conv.nbytes(shape, batch)
                + ssu.nbytes(shape, batch, sdt, True)
                + norm.nbytes(shape, batch, False)
            )
            nb_vllm = (
                conv.nbytes(shape, batch)
                + ssu.nbytes(shape, batch, sdt, False)
                + norm.nbytes(shape, batch, True)
            )
            vllm_us = harness.time_rotating(
                lambda: three_kernels(shape, batch, sdt, False), nb_vllm
            )
            ours_us = harness.time_rotating(lambda: three_kernels(shape, batch, sdt, True), nb_ours)
            bench.record("decode_tail", model, name, batch, ours_us, vllm_us, nb_ours, nb_vllm)
            nb_fused = fused_nbytes(shape, batch, sdt)
            for kernel, with_norm in (
                ("decode_tail_fused_conv", False),
                ("decode_tail_fused", True),
            ):
                us = harness.time_rotating(
                    lambda: ours_fused(inputs(shape, batch, sdt), shape, with_norm), nb_fused
                )
                bench.record(kernel, model, name, batch, us, vllm_us, nb_fused, nb_vllm)


if __name__ == "__main__":
    harness.run([compare], "kernels-mamba2_decode", harness.parser(__doc__).parse_args())
