"""The Triton kernel of the state slot copies and its launches (no checks): see
interface.py. One pass of wide loads and stores per row; a gathered row without an initial
state reads nothing; an int8 state's gather dequantizes in the same pass."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_BLOCK = 4096
_WARPS = 8


# Not specialised: the slots and the rows' has-initial-state flags (one scalar a program) are
# slices of vLLM's metadata at the step's decode count, or a column of its block table, so
# their alignment and stride vary from step to step.
@triton.jit(
    do_not_specialize=["slot_stride"], do_not_specialize_on_alignment=["slots_ptr", "keep_ptr"]
)
def _state_slot_copy_kernel(
    src_ptr,
    dst_ptr,
    slots_ptr,
    keep_ptr,
    per_slot,
    src_row,
    dst_row,
    slot_stride,
    scale_ptr,
    scale_row,
    d_state,
    GATHER: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    DEQUANTIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < per_slot
    # int64 before the multiply: slot x slot stride passes 2^31 in a large state cache.
    slot = tl.load(slots_ptr + row * slot_stride).to(tl.int64)
    if GATHER:
        src = src_ptr + slot * src_row
        dst = dst_ptr + row * dst_row
    else:
        src = src_ptr + row * src_row
        dst = dst_ptr + slot * dst_row
    load_end = per_slot
    if HAS_KEEP:  # a row without an initial state reads nothing and stores zeros
        load_end = tl.where(tl.load(keep_ptr + row) != 0, per_slot, 0)
    values = tl.load(src + offs, mask=offs < load_end, other=0)
    if DEQUANTIZE:  # an int8 row's elements times its scale (one per d_state elements)
        scale = tl.load(scale_ptr + slot * scale_row + offs // d_state, mask=offs < load_end)
        values = values.to(tl.float32) * scale
    tl.store(dst + offs, values, mask=ok)


def launch(
    src: torch.Tensor,
    dst: torch.Tensor,
    slots: torch.Tensor,
    keep: torch.Tensor | None,
    src_row: int,
    dst_row: int,
    gather: bool,
    scale: torch.Tensor | None = None,
) -> None:
    """Copies each row between ``src`` and ``dst`` through ``slots`` (``gather``: from slot to
    row, else row to slot); ``keep`` (uint8) zeroes gathered rows; a gather with ``scale``
    (an int8 ``src``'s scales) writes fp32 values. No checks (the interface and the decode
    plan check)."""
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
            slots.stride(0),  # a column of vLLM's block table under speculative decoding
            scale if scale is not None else src,
            scale.stride(0) if scale is not None else 0,
            dst.shape[-1],
            GATHER=gather,
            HAS_KEEP=keep is not None,
            DEQUANTIZE=scale is not None,
            BLOCK=_BLOCK,
            num_warps=_WARPS,
        )


def gather(
    state: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gather's launch into a new (rows, *per_slot) tensor (fp32 with ``scale``); no
    checks."""
    dtype = state.dtype if scale is None else torch.float32
    out = torch.empty((slots.shape[0], *state.shape[1:]), dtype=dtype, device=state.device)
    keep = has_initial.view(torch.uint8) if has_initial is not None else None
    launch(state, out, slots, keep, state.stride(0), out.stride(0), True, scale)
    return out


def scatter(state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """The scatter's launch; no checks."""
    launch(values, state, slots, None, values.stride(0), state.stride(0), False)
