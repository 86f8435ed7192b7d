"""The selective state update written as its formula, one sequence at a time, in
fp64 on the CPU (the test oracle; production never calls it)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.state_format import dequantize, quantize


def selective_state_update_reference(
    state: torch.Tensor, step: StateUpdateStep, state_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Same effects as ``selective_state_update`` (see interface.py); returns the output
    (``step.out`` when given)."""
    batch, nheads, head_dim = step.x.shape
    heads_per_group = nheads // step.B.shape[1]
    f64 = [t.detach().cpu().double() for t in (step.x, step.dt, step.A, step.B, step.C, step.D)]
    xs, dts, As, Bs, Cs, Ds = f64
    zs = step.z.detach().cpu().double() if step.z is not None else None
    bias = step.dt_bias.detach().cpu().double()
    state_slots, null_slot = step.state_slots, step.null_slot
    y = torch.zeros(batch, nheads, head_dim, dtype=torch.float64)
    group = torch.arange(nheads) // heads_per_group  # the group of each head
    for b in range(batch):
        slot = int(state_slots[b]) if state_slots is not None else b
        if slot == null_slot:
            continue
        dt_b = torch.nn.functional.softplus(dts[b] + bias)  # (nheads,)
        Bh, Ch = Bs[b, group], Cs[b, group]  # (nheads, d_state): each head's group
        s = state[slot].cpu().double()  # (nheads, head_dim, d_state)
        if state_scale is not None:  # int8 rows and their scales
            s = dequantize(state[slot].cpu(), state_scale[slot].cpu().double())
        s = (
            s * torch.exp(As * dt_b)[:, None, None]
            + (dt_b[:, None] * xs[b])[..., None] * Bh[:, None, :]
        )
        if state_scale is None:
            state[slot] = s.to(state.dtype)
        else:
            q, scale = quantize(s)
            state[slot], state_scale[slot] = q.to(state.device), scale.to(state_scale)
        y[b] = (s * Ch[:, None, :]).sum(-1) + Ds[:, None] * xs[b]
        if zs is not None:
            y[b] *= torch.nn.functional.silu(zs[b])
    out = step.out if step.out is not None else torch.empty_like(step.x)
    return out.copy_(y)
