"""The selective state update written as its formula, one sequence and head at a time, in
fp64 on the CPU (the test oracle; production never calls it)."""

from __future__ import annotations

import torch


def selective_state_update_reference(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None = None,
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and effects as ``selective_state_update`` (see interface.py)."""
    batch, nheads, head_dim = x.shape
    heads_per_group = nheads // B.shape[1]
    f64 = [t.detach().cpu().double() if t is not None else None for t in (x, dt, A, B, C, D)]
    xs, dts, As, Bs, Cs, Ds = f64
    zs = z.detach().cpu().double() if z is not None else None
    bias = dt_bias.detach().cpu().double()
    y = torch.zeros(batch, nheads, head_dim, dtype=torch.float64)
    for b in range(batch):
        slot = int(state_slots[b]) if state_slots is not None else b
        if slot == null_slot:
            continue
        for h in range(nheads):
            g = h // heads_per_group
            dt_h = torch.nn.functional.softplus(dts[b, h] + bias[h])
            s = state[slot, h].cpu().double()  # (head_dim, d_state)
            s = s * torch.exp(As[h] * dt_h) + dt_h * xs[b, h][:, None] * Bs[b, g][None, :]
            state[slot, h] = s.to(state.dtype)
            y[b, h] = s @ Cs[b, g] + Ds[h] * xs[b, h]
            if zs is not None:
                y[b, h] *= torch.nn.functional.silu(zs[b, h])
    if out is None:
        out = torch.empty_like(x)
    return out.copy_(y)
