"""The Triton kernel of the prefill tail and its launch (no checks): see interface.py. One
grid of two kinds of programs: the first normalise one (token, group) of y each (ops/rms_norm's
program), the others write one tile of a sequence's final state into its slot, quantizing
the rows of an int8 state."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.kernel import group_norm_program
from vllm_nemotron_h.ops.triton_helpers import store_state_tile

_TILE = 4096  # state elements per program: 16 KB of fp32, as the slot copy moves
# 4 warps: a 1,024-wide norm group loads 16 bytes per thread; at the copy floor of the tail's
# bytes on the H100 (benchmarks/results/kernels-mamba2_prefill_tail-warps-h100.json), 8 slower
_WARPS = 4


# Not specialised (no compile per value): norm_programs changes with every step's token
# count; the slots (loaded one scalar a program) are a slice of vLLM's metadata at the step's
# decode count, or a column of its block table, so their alignment and stride vary.
@triton.jit(
    do_not_specialize=["norm_programs", "slot_stride"],
    do_not_specialize_on_alignment=["slots_ptr"],
)
def _prefill_tail_kernel(
    y_ptr, gate_ptr, w_ptr, y_row, gate_row, group_size, groups, eps, norm_programs,
    values_ptr, state_ptr, scale_ptr, slots_ptr, slot_stride, state_slot, scale_slot,
    values_row, state_rows, tiles, d_state,
    QUANTIZED: tl.constexpr, NORM_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if pid < norm_programs:
        group_norm_program(
            y_ptr, gate_ptr, w_ptr, y_ptr, pid // groups, pid % groups, group_size, eps,
            y_row, gate_row, y_row, True, NORM_BLOCK,
        )  # fmt: skip
    else:
        t = pid - norm_programs
        row = (t // tiles).to(tl.int64)
        rows = (t % tiles) * BLOCK_M + tl.arange(0, BLOCK_M)  # (head, head_dim row) of a slot
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < state_rows
        ok = row_ok[:, None] & (cols < d_state)[None, :]
        # int64 before the multiply: slot x slot stride passes 2^31 in a large state cache.
        slot = tl.load(slots_ptr + row * slot_stride).to(tl.int64)
        offs = rows[:, None] * d_state + cols[None, :]
        v = tl.load(values_ptr + row * values_row + offs, mask=ok, other=0.0)
        store_state_tile(
            state_ptr + slot * state_slot + offs, scale_ptr + slot * scale_slot + rows,
            v.to(tl.float32), ok, row_ok, QUANTIZED,
        )  # fmt: skip


def launch(
    y: torch.Tensor | None, gate: torch.Tensor | None, norm: GroupNorm | None, states: FinalStates
) -> None:
    """Launches the tail; ``y`` None: the states alone. No argument checks (the interface
    and the decode plan check)."""
    tokens, groups, group_size, eps = 0, 1, 1, 0.0
    if y is not None:
        tokens, group_size, eps = y.shape[0], norm.group_size, norm.eps
        groups = y.shape[1] // group_size
    s = states
    _, nheads, head_dim, d_state = s.ssm_state.shape
    state_rows = nheads * head_dim
    block_n = triton.next_power_of_2(d_state)
    block_m = min(triton.next_power_of_2(state_rows), max(1, _TILE // block_n))
    tiles = triton.cdiv(state_rows, block_m)
    norm_programs = tokens * groups
    programs = norm_programs + s.slots.shape[0] * tiles
    if not programs:
        return
    quantized = s.ssm_scale is not None
    _prefill_tail_kernel[(programs,)](
        y if y is not None else s.values, gate if gate is not None else s.values,
        norm.weight if norm is not None else s.values,
        y.stride(0) if y is not None else 0, gate.stride(0) if gate is not None else 0,
        group_size, groups, eps, norm_programs,
        s.values, s.ssm_state, s.ssm_scale if quantized else s.ssm_state, s.slots,
        s.slots.stride(0), s.ssm_state.stride(0), s.ssm_scale.stride(0) if quantized else 0,
        s.values.stride(0), state_rows, tiles, d_state,
        QUANTIZED=quantized, NORM_BLOCK=triton.next_power_of_2(group_size), BLOCK_M=block_m,
        BLOCK_N=block_n, num_warps=_WARPS,
    )  # fmt: skip
