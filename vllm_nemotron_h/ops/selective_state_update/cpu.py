"""The CPU serving path of the selective state update: the whole batch in a few PyTorch ops
(gather the live slots, one fused update, scatter back)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.state_format import dequantize, quantize


def selective_state_update_cpu(
    state: torch.Tensor, state_scale: torch.Tensor | None, step: StateUpdateStep
) -> torch.Tensor:
    """Same effects as the interface's ``selective_state_update`` (``step.out`` given); no
    checks."""
    x, z, out = step.x, step.z, step.out
    batch, nheads, head_dim = x.shape
    heads_per_group = nheads // step.B.shape[1]
    slots = step.state_slots
    if slots is None:
        slots = torch.arange(batch, device=x.device)
    live = slots != step.null_slot
    idx = slots[live]
    s = state[idx].float() if state_scale is None else dequantize(state[idx], state_scale[idx])
    dt_f = torch.nn.functional.softplus(step.dt[live].float() + step.dt_bias)  # (n, h)
    Bh = step.B[live].float().repeat_interleave(heads_per_group, dim=1)  # (n, h, d_state)
    Ch = step.C[live].float().repeat_interleave(heads_per_group, dim=1)
    xf = x[live].float()
    decay = torch.exp(step.A * dt_f)[..., None, None]
    s = s * decay + (dt_f[..., None] * xf)[..., None] * Bh[:, :, None, :]
    if state_scale is None:
        state[idx] = s.to(state.dtype)
    else:
        state[idx], state_scale[idx] = quantize(s)
    y = (s * Ch[:, :, None, :]).sum(-1) + step.D[:, None] * xf
    if z is not None:
        y = y * torch.nn.functional.silu(z[live].float())
    out.zero_()
    out[live] = y.to(out.dtype)
    return out
