"""The CPU serving path of the selective state update: the whole batch in a few PyTorch ops
(gather the live slots, one fused update, scatter back)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.state_format import dequantize, quantize


def selective_state_update_cpu(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None,
    state_slots: torch.Tensor | None,
    null_slot: int,
    out: torch.Tensor,
    state_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and effects as the interface's ``selective_state_update`` (``out``
    given); no checks."""
    batch, nheads, head_dim = x.shape
    heads_per_group = nheads // B.shape[1]
    slots = state_slots if state_slots is not None else torch.arange(batch, device=x.device)
    live = slots != null_slot
    idx = slots[live]
    s = state[idx].float() if state_scale is None else dequantize(state[idx], state_scale[idx])
    dt_f = torch.nn.functional.softplus(dt[live].float() + dt_bias)  # (n, h)
    Bh = B[live].float().repeat_interleave(heads_per_group, dim=1)  # (n, h, d_state)
    Ch = C[live].float().repeat_interleave(heads_per_group, dim=1)
    xf = x[live].float()
    decay = torch.exp(A * dt_f)[..., None, None]
    s = s * decay + (dt_f[..., None] * xf)[..., None] * Bh[:, :, None, :]
    if state_scale is None:
        state[idx] = s.to(state.dtype)
    else:
        state[idx], state_scale[idx] = quantize(s)
    y = (s * Ch[:, :, None, :]).sum(-1) + D[:, None] * xf
    if z is not None:
        y = y * torch.nn.functional.silu(z[live].float())
    out.zero_()
    out[live] = y.to(out.dtype)
    return out
