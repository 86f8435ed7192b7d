"""The state slot copies written literally, one row at a time (the test oracle; production
never calls them)."""

from __future__ import annotations

import torch


def gather_state_slots_reference(
    state: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and result as ``gather_state_slots`` (see interface.py)."""
    dtype = state.dtype if scale is None else torch.float32
    out = torch.zeros((slots.shape[0], *state.shape[1:]), dtype=dtype)
    for row in range(slots.shape[0]):
        if has_initial is None or bool(has_initial[row]):
            slot = int(slots[row])
            if scale is None:
                out[row] = state[slot]
            else:  # each d_state row of int8 values times its scale
                out[row] = state[slot].to(torch.float32) * scale[slot][..., None]
    return out.to(state.device)


def scatter_state_slots_reference(
    state: torch.Tensor, slots: torch.Tensor, values: torch.Tensor
) -> None:
    """Same arguments and effect as ``scatter_state_slots`` (see interface.py)."""
    for row in range(slots.shape[0]):
        state[int(slots[row])] = values[row]
