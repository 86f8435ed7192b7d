"""Copies between a state cache and the rows of a prefill batch, through the rows' slots.

``gather_state_slots(state, slots, has_initial, scale)`` -> (rows, *state.shape[1:]): row i
is ``state[slots[i]]``, or zeros where ``has_initial[i]`` is False (the initial states of a
chunked scan; no read at all for rows without one). With ``scale``, an int8 state's per-row
scales (num_slots, *per_slot[:-1]) fp32, row i is dequantized in the same pass:
``state[slots[i]] * scale[slots[i]][..., None]`` in fp32, as the scan reads it.

``scatter_state_slots(state, slots, values)``: ``state[slots[i]] = values[i]`` (the final
states of a prefill written into their slots).

Shapes: state (num_slots, *per_slot) with each slot contiguous (vLLM's state views may pad the
slot stride), slots (rows,) int32 or int64 of any stride (a column of vLLM's block table),
has_initial (rows,) bool, values (rows, *per_slot) with each row contiguous and state's dtype.
Any dtype; a plain copy, no conversion (but the int8 gather's dequantization).
Why a kernel: PyTorch's index_put / index + where move the state at ~0.8 TB/s on the H100
(16.4 ms of a 128-sequence Nemotron-H 8B prefill, bf16 state); these are one pass of
16-byte loads and stores, and the gather reads nothing for rows without an initial state.
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.state_slot_copy import kernel
from vllm_nemotron_h.ops.state_slot_copy.cpu import gather_state_slots_cpu, scatter_state_slots_cpu
from vllm_nemotron_h.ops.support import check_tensor, use_triton


def check_state(state: torch.Tensor, slots: torch.Tensor) -> None:
    """Raises ValueError unless ``state`` is (num_slots, ...) with contiguous slots and
    ``slots`` int32/int64 on its device."""
    check_tensor("state", state)
    if state.dim() < 2 or not state[0].is_contiguous():
        raise ValueError(
            "state must be (num_slots, ...) with each slot contiguous, got shape "
            f"{tuple(state.shape)} and strides {state.stride()}"
        )
    check_tensor("slots", slots, (None,), (torch.int32, torch.int64), state.device)


def check_gather(
    state: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None,
    scale: torch.Tensor | None = None,
) -> None:
    """Raises ValueError naming the first argument of a gather that does not fit."""
    check_state(state, slots)
    if has_initial is not None:
        check_tensor("has_initial", has_initial, (slots.shape[0],), (torch.bool,), state.device)
    if scale is not None:
        if state.dtype != torch.int8:
            raise ValueError(f"scale goes with an int8 state only, got state dtype {state.dtype}")
        check_tensor("scale", scale, tuple(state.shape[:-1]), (torch.float32,), state.device)
        if not scale[0].is_contiguous():
            raise ValueError(f"scale must have each slot contiguous, got strides {scale.stride()}")


def check_scatter(state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Raises ValueError naming the first argument of a scatter that does not fit."""
    check_state(state, slots)
    check_tensor("values", values, (slots.shape[0], *state.shape[1:]), None, state.device)
    if values.dtype != state.dtype:
        raise ValueError(f"values must have state's dtype {state.dtype}, got {values.dtype}")
    if values.shape[0] and not values[0].is_contiguous():
        raise ValueError(f"values must have each row contiguous, got strides {values.stride()}")


def gather_state_slots(
    state: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The slots' states as a new contiguous (rows, *per_slot) tensor; rows whose
    ``has_initial`` is False are zeros; with ``scale`` (int8 ``state``) dequantized, fp32."""
    check_gather(state, slots, has_initial, scale)
    if not use_triton(state):
        return gather_state_slots_cpu(state, slots, has_initial, scale)
    return kernel.gather(state, slots, has_initial, scale)


def scatter_state_slots(state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Writes ``values[i]`` into slot ``slots[i]`` of ``state`` (slots must be distinct)."""
    check_scatter(state, slots, values)
    if not use_triton(state):
        scatter_state_slots_cpu(state, slots, values)
        return
    kernel.scatter(state, slots, values)
