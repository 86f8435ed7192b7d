"""The decode tail under speculative decoding (ops/mamba2_speculative_decode: conv, a state
update that keeps each token's state in its slot, group norm) on the GPU, every row verifying
K drafts (K + 1 tokens), against vLLM 0.32's state update in its speculative form (accepted
counts, a destination slot per token) when its kernels are importable as ``v32ops``
(../shared/anchors/extract_vllm032_ops.py). vLLM's column is its state update alone (its conv
update and norm are not in v32ops); ``ours_no_norm_us`` is the plugin's conv and state
update without the norm. An int8 state is compared with vLLM's on a bf16 state.

    python benchmarks/kernels/mamba2_speculative_decode.py [--drafts 3] [--batches 1,32,128]

Writes benchmarks/results/kernels-mamba2_speculative_decode-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import selective_state_update as ssu
import torch

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.mamba2_speculative_decode import interface
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape, record_of


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype, tokens: int) -> dict:
    """Every row ``tokens`` tokens (its target and drafts) and an output buffer."""
    case = LayerCase(harness.draw(), shape, batch, state_dtype, harness.ACT, 1, None)
    t = case.speculative(tokens, full=True)
    t["out"] = torch.empty_like(t["z"])
    return t


def nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype, tokens: int) -> int:
    """The plugin's tail: a row's state read once and written per token (an int8 state's
    scales likewise), the conv window read and the new one written, xbc, z and dt read, out
    written, then read and written by the norm."""
    s, act, T = shape, harness.ACT.itemsize, tokens
    scale = 4 if state_dtype == torch.int8 else 0  # an fp32 scale per row
    state = (1 + T) * s.nheads * s.head_dim * (s.d_state * state_dtype.itemsize + scale)
    conv = (2 * (s.width - 1) + T - 1) * s.conv_dim * act
    return batch * (state + conv + T * (s.conv_dim + 4 * s.inner + s.nheads) * act)


def vllm_nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype, tokens: int) -> int:
    """vLLM's state update: the state read once and written per token; x, B, C, dt read and
    out written per token."""
    s, act, T = shape, harness.ACT.itemsize, tokens
    state = (1 + T) * s.nheads * s.head_dim * s.d_state * state_dtype.itemsize
    return batch * (state + T * (2 * s.inner + 2 * s.ngroups * s.d_state + s.nheads) * act)


def ours(t: dict, norm: bool = True) -> Callable[[], object]:
    """The interface's launch with the device table's configs (no value checks: they sync)."""
    t = dict(t, norm_weight=t["norm_weight"] if norm else None)
    layer, step = record_of(DecodeLayer, t, null_slot=0), record_of(SpeculativeStep, t)
    configs = interface.launch_configs(layer, step)
    return lambda: interface.run(layer, step, configs)


def v32(t: dict, shape: MambaShape) -> Callable[[], object]:
    """vLLM 0.32's state update as its Mamba2 layer calls it under speculative decoding (on the
    conv output that the plugin's tail would compute: here the raw xbc, the same bytes)."""
    from v32ops.mamba_ssm import selective_state_update as v

    x, B, C = split_xbc(t["xbc"], shape.nheads, shape.head_dim, shape.d_state)
    a = ssu.broadcast(t, shape)
    out = t["out"].view(x.shape)
    return lambda: v(
        t["ssm_state"], x, a["dt"], a["A"], B, C, a["D"], a["dt_bias"], dt_softplus=True,
        state_batch_indices=a["slots"], dst_state_batch_indices=a["slots"], null_block_id=0,
        out=out, num_accepted_tokens=t["num_accepted"].to(torch.int32),
        cu_seqlens=t["query_start"].to(torch.int32),
    )  # fmt: skip


def comparison(drafts: int) -> harness.Compare:
    """The rows of every state dtype and batch, each row verifying ``drafts`` drafts."""
    tokens = 1 + drafts

    def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
        shape = MambaShape.of_model(model)
        with_v32 = ssu.vllm032_available()
        for sdt in state_dtypes:
            vllm_sdt = torch.bfloat16 if sdt == torch.int8 else sdt
            for batch in batches:
                nb = nbytes(shape, batch, sdt, tokens)
                nb_vllm = vllm_nbytes(shape, batch, vllm_sdt, tokens)

                def timed(make: Callable[[dict], Callable[[], object]], dtype, n) -> float:
                    return harness.time_rotating(
                        lambda: make(inputs(shape, batch, dtype, tokens)), n
                    )

                ours_us = timed(ours, sdt, nb)
                no_norm_us = timed(lambda t: ours(t, norm=False), sdt, nb)
                vllm_us = timed(lambda t: v32(t, shape), vllm_sdt, nb_vllm) if with_v32 else 0.0
                bench.record(
                    "speculative_tail", model, harness.dtype_name(sdt), batch, ours_us,
                    vllm_us or float("nan"), nb, nb_vllm, ours_no_norm_us=round(no_norm_us, 3),
                    tokens=tokens,
                )  # fmt: skip

    return compare


if __name__ == "__main__":
    parser = harness.parser(__doc__, (*harness.STATE_DTYPES, "int8"))
    parser.add_argument("--drafts", type=int, default=3, help="draft tokens per row")
    args = parser.parse_args()
    harness.run([comparison(args.drafts)], "kernels-mamba2_speculative_decode", args)
