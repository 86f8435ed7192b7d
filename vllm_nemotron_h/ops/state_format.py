"""The int8 SSM state format, in PyTorch (the CPU paths and the references; the Triton
kernels quantize with triton_helpers.quantize_rows, the same formula in fp32, and the state
update with store_quantized_step, the same formula for rows it holds as f * u).

A state row is one (slot, head, head_dim row) over d_state. It is stored as symmetric int8
values q in [-127, 127] and one fp32 scale: value = q * scale, scale = max |row| / 127,
recomputed from the row at every write; q = clamp(floor(value / scale + 1/2)), i.e. rounded
to nearest (the GPU's state update rounds ties to even: store_quantized_step). A row whose
max |value| is at most MIN_ROW_MAX (zeros, or values decayed to fp32's subnormal range, where
127 / max would overflow) stores scale 0 and q 0. The scales of a state of shape
(num_slots, nheads, head_dim, d_state) have shape (num_slots, nheads, head_dim).
"""

from __future__ import annotations

import torch

INT8_MAX = 127
MIN_ROW_MAX = 1e-30


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The values of int8 rows ``q`` (..., d_state) with their scales (...,), in the scale's
    dtype."""
    return q.to(scale.dtype) * scale[..., None]


def quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, scale) of rows ``values`` (..., d_state), the scale in the values' dtype."""
    amax = values.abs().amax(dim=-1)
    kept = amax > MIN_ROW_MAX
    scale = torch.where(kept, amax / INT8_MAX, torch.zeros_like(amax))
    inv = torch.where(kept, INT8_MAX / amax, torch.zeros_like(amax))
    q = torch.floor(values * inv[..., None] + 0.5).clamp(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale
