"""The state update with deferred writes (ring of L tokens, checkpoint written every L steps)
against vLLM 0.32's ReplaySSM (its window L = 16) and the plugin's per-step update, on the GPU.

Each call advances every row by one token and the graph replays the call many times, so the
rows cycle through their rings as they do when serving: with each row starting at a random
ring length, one row in L writes back per step, and the time per call is the amortised time
of a step. ``vllm_us`` is ReplaySSM amortised over its 16 steps on the same state dtype (an
int8 checkpoint: on an fp32 state; ``replay_bf16_us`` on a bf16 one), or, without v32ops
(see selective_state_update.py), vLLM's installed per-step kernel. ``step_us`` is the plugin's
per-step update on the same format.

    python benchmarks/kernels/deferred_state_update.py [--models M,..] [--batches 1,128]

Writes benchmarks/results/kernels-deferred_state_update-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import selective_state_update as ssu
import torch

from vllm_nemotron_h.ops.deferred_state_update import deferred_state_update
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape, record_of

RING_SIZE = 16


def inputs(shape: MambaShape, batch: int, state_dtype: torch.dtype, ring: int = RING_SIZE):
    """The engine's layout, every row a live sequence, and an output buffer."""
    case = LayerCase(harness.draw(), shape, batch, state_dtype, harness.ACT, 1, None)
    t = case.deferred(ring)
    t["out"] = torch.empty_like(t["x"])
    return t


def nbytes(shape: MambaShape, batch: int, state_dtype: torch.dtype, ring: int = RING_SIZE):
    """Bytes per step, amortised over the ring: the checkpoint read (and its int8 scales),
    written one step in ``ring``; the ring entries read (on average (ring - 1) / 2 of them) and
    the one written; x, z, out, B, C and dt of each row."""
    s, act = shape, harness.ACT.itemsize
    rows = s.nheads * s.head_dim
    checkpoint = rows * (s.d_state * state_dtype.itemsize + (4 if state_dtype == torch.int8 else 0))
    entry = rows * act + s.nheads * 4 + s.ngroups * s.d_state * act
    return batch * (
        checkpoint * (1 + 1 / ring)
        + entry * ((ring - 1) / 2 + 1)
        + 3 * s.inner * act
        + 2 * s.ngroups * s.d_state * act
        + s.nheads * act
        + 8 * s.nheads
    )


def ours(t: dict, config: tuple[int, int] | None = None) -> Callable[[], object]:
    step = record_of(StateUpdateStep, t, null_slot=0)
    return lambda: deferred_state_update(t["state"], step, config)


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    with_v32 = ssu.vllm032_available()
    for sdt in state_dtypes:
        for batch in batches:
            nb = int(nbytes(shape, batch, sdt))
            step_nb = ssu.nbytes(shape, batch, sdt, True)
            step = harness.time_rotating(lambda: ssu.ours(ssu.inputs(shape, batch, sdt)), step_nb)
            extra = dict(step_us=round(step, 3))
            versus = torch.float32 if sdt == torch.int8 else sdt
            # ReplaySSM moves what the deferred update moves on its format; vLLM's per-step
            # kernel what the per-step update moves.
            vs_nb = (
                int(nbytes(shape, batch, versus))
                if with_v32
                else ssu.nbytes(shape, batch, versus, True)
            )
            if with_v32:
                replay = ssu.vllm032_columns(shape, batch, versus, "_vs")["replay_vs_us"]
                if sdt == torch.int8:
                    bf16 = ssu.vllm032_columns(shape, batch, torch.bfloat16, "_vs")
                    extra["replay_bf16_us"] = bf16["replay_vs_us"]
            else:
                replay = harness.time_rotating(
                    lambda: ssu.vllm(ssu.inputs(shape, batch, versus), shape), vs_nb
                )
            bench.record(
                "deferred_state_update", model, harness.dtype_name(sdt), batch,
                harness.time_rotating(lambda: ours(inputs(shape, batch, sdt)), nb),
                replay, nb, vs_nb, **extra,
            )  # fmt: skip


if __name__ == "__main__":
    args = harness.parser(__doc__, (*harness.STATE_DTYPES, "int8")).parse_args()
    harness.run([compare], "kernels-deferred_state_update", args)
