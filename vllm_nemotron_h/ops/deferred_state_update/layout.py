"""A Mamba2 layer's SSM state with deferred writes: per slot, a checkpoint of the state and a
ring of the tokens since it, written back into the checkpoint every ``ring_size`` tokens.

For slot ``s`` and head ``h``, with ``n`` tokens in the ring (0 <= n < L)::

    state = checkpoint[s, h] advanced by tokens k = 0 .. n-1 of the ring:
            state <- state * exp(A[h] * ring_dt[s, h, k]) + ring_dt[s, h, k] * x_k (x) B_k
    x_k = ring_x[s, h, k], B_k = ring_B[s, g, k] (g the head's group)

``ring_len[s, h]`` holds n (the kernel's program of head h reads and writes it alone).
``ring_dt`` holds softplus(dt + dt_bias), the step size the per-step update computes; x and B
are kept in the activation dtype they arrive in, so the ring loses nothing. The checkpoint
is in the layer's state format (fp32 / bf16 / fp16, or int8 with an fp32 scale per row,
ops/state_format.py); it is rounded to it only when the ring is written back, every L
tokens, instead of at every token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeferredState:
    """The per-slot tensors of a layer's deferred state (see module doc)."""

    checkpoint: torch.Tensor  # (num_slots, nheads, head_dim, d_state), the state format
    checkpoint_scale: torch.Tensor | None  # (num_slots, nheads, head_dim) fp32, int8 only
    ring_x: torch.Tensor  # (num_slots, nheads, L, head_dim), activation dtype
    ring_dt: torch.Tensor  # (num_slots, nheads, L) fp32
    ring_B: torch.Tensor  # (num_slots, ngroups, L, d_state), activation dtype
    ring_len: torch.Tensor  # (num_slots, nheads) int32

    @property
    def ring_size(self) -> int:
        return self.ring_dt.shape[-1]


@dataclass(slots=True)
class RingFlush:
    """A write-back without a token: the slots whose rings go into their checkpoints (null
    slots skipped) and the heads' decay A (nheads,) fp32. The kernel, the CPU path and the
    reference take it where a step takes a ``StateUpdateStep``."""

    A: torch.Tensor
    state_slots: torch.Tensor
    null_slot: int = -1


def ring_shapes(
    nheads: int, head_dim: int, d_state: int, ngroups: int, ring_size: int
) -> tuple[tuple[int, ...], ...]:
    """Per-slot shapes of (ring_x, ring_dt, ring_B, ring_len)."""
    return (
        (nheads, ring_size, head_dim),
        (nheads, ring_size),
        (ngroups, ring_size, d_state),
        (nheads,),
    )


def ring_dtypes(activation_dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """Dtypes of (ring_x, ring_dt, ring_B, ring_len)."""
    return (activation_dtype, torch.float32, activation_dtype, torch.int32)


def with_empty_rings(
    checkpoint: torch.Tensor,
    checkpoint_scale: torch.Tensor | None,
    ngroups: int,
    ring_size: int,
    activation_dtype: torch.dtype,
) -> DeferredState:
    """A deferred state around ``checkpoint`` (and its int8 scales), every ring empty."""
    num_slots, nheads, head_dim, d_state = checkpoint.shape
    shapes = ring_shapes(nheads, head_dim, d_state, ngroups, ring_size)
    rings = (
        torch.zeros((num_slots, *shape), dtype=dtype, device=checkpoint.device)
        for shape, dtype in zip(shapes, ring_dtypes(activation_dtype), strict=True)
    )
    return DeferredState(checkpoint, checkpoint_scale, *rings)
