"""Copies between a state cache and the rows of a prefill batch, through the rows' slots.

``gather_state_slots(state, slots, has_initial)`` -> (rows, *state.shape[1:]): row i is
``state[slots[i]]``, or zeros where ``has_initial[i]`` is False (the initial states of a
chunked scan; no read at all for rows without one).

``scatter_state_slots(state, slots, values)``: ``state[slots[i]] = values[i]`` (the final
states of a prefill written into their slots).

Shapes: state (num_slots, *per_slot) with each slot contiguous (vLLM's state views may pad the
slot stride), slots (rows,) int32 or int64, has_initial (rows,) bool, values (rows, *per_slot)
with each row contiguous and state's dtype. Any dtype; a plain copy, no conversion.
Why a kernel: PyTorch's index_put / index + where move the state at ~0.8 TB/s on the H100
(16.4 ms of a 128-sequence Nemotron-H 8B prefill, bf16 state); these are one pass of
16-byte loads and stores, and the gather reads nothing for rows without an initial state.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.kernels._common import check_tensor, use_triton

_BLOCK = 4096
_WARPS = 8


@triton.jit
def _state_slot_copy_kernel(
    src_ptr,
    dst_ptr,
    slots_ptr,
    keep_ptr,
    per_slot,
    src_row,
    dst_row,
    GATHER: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < per_slot
    # int64 before the multiply: slot x slot stride passes 2^31 in a large state cache.
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if GATHER:
        src = src_ptr + slot * src_row
        dst = dst_ptr + row * dst_row
    else:
        src = src_ptr + row * src_row
        dst = dst_ptr + slot * dst_row
    load_end = per_slot
    if HAS_KEEP:  # a row without an initial state reads nothing and stores zeros
        load_end = tl.where(tl.load(keep_ptr + row) != 0, per_slot, 0)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < load_end, other=0), mask=ok)


def gather_state_slots_ref(
    state: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain-PyTorch reference with the same signature and result (the CPU path)."""
    rows = state[slots.long()]
    if has_initial is None:
        return rows
    return torch.where(has_initial.view(-1, *[1] * (state.dim() - 1)), rows, 0)


def scatter_state_slots_ref(state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Plain-PyTorch reference with the same signature and effect (the CPU path)."""
    state[slots.long()] = values


def _check_slots(state: torch.Tensor, slots: torch.Tensor) -> None:
    check_tensor("state", state)
    if state.dim() < 2 or not state[0].is_contiguous():
        raise ValueError(
            "state must be (num_slots, ...) with each slot contiguous, got shape "
            f"{tuple(state.shape)} and strides {state.stride()}"
        )
    check_tensor("slots", slots, (None,), (torch.int32, torch.int64), state.device)


def _launch(src, dst, slots, keep, src_row: int, dst_row: int, gather: bool) -> None:
    per_slot = math.prod(dst.shape[1:])
    if slots.shape[0] and per_slot:
        _state_slot_copy_kernel[(slots.shape[0], triton.cdiv(per_slot, _BLOCK))](
            src,
            dst,
            slots,
            keep if keep is not None else slots,
            per_slot,
            src_row,
            dst_row,
            GATHER=gather,
            HAS_KEEP=keep is not None,
            BLOCK=_BLOCK,
            num_warps=_WARPS,
        )


def gather_state_slots(
    state: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor | None = None
) -> torch.Tensor:
    """The slots' states as a new contiguous (rows, *per_slot) tensor; rows whose
    ``has_initial`` is False are zeros."""
    _check_slots(state, slots)
    if has_initial is not None:
        check_tensor("has_initial", has_initial, (slots.shape[0],), (torch.bool,), state.device)
    if not use_triton(state):
        return gather_state_slots_ref(state, slots, has_initial)
    out = torch.empty((slots.shape[0], *state.shape[1:]), dtype=state.dtype, device=state.device)
    keep = has_initial.view(torch.uint8) if has_initial is not None else None
    _launch(state, out, slots, keep, state.stride(0), out.stride(0), True)
    return out


def scatter_state_slots(state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Writes ``values[i]`` into slot ``slots[i]`` of ``state`` (slots must be distinct)."""
    _check_slots(state, slots)
    check_tensor("values", values, (slots.shape[0], *state.shape[1:]), None, state.device)
    if values.dtype != state.dtype:
        raise ValueError(f"values must have state's dtype {state.dtype}, got {values.dtype}")
    if values.shape[0] and not values[0].is_contiguous():
        raise ValueError(f"values must have each row contiguous, got strides {values.stride()}")
    if not use_triton(state):
        scatter_state_slots_ref(state, slots, values)
        return
    _launch(values, state, slots, None, values.stride(0), state.stride(0), False)
