"""The CPU serving path of the state update with deferred writes: the whole batch in a few
PyTorch ops (gather the live slots' checkpoints and rings, one fused evaluation, scatter back
what changed)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState, RingFlush
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.state_format import dequantize, quantize


def deferred_state_update_cpu(state: DeferredState, step: StateUpdateStep | RingFlush) -> None:
    """Same effects as the interface's ``deferred_state_update`` (``step.out`` and
    ``step.state_slots`` given), or, for a ``RingFlush``, as ``flush_deferred_state``; no
    checks."""
    A, state_slots = step.A, step.state_slots
    L = state.ring_size
    nheads = state.checkpoint.shape[1]
    hpg = nheads // state.ring_B.shape[1]
    live = state_slots != step.null_slot
    idx = state_slots[live]
    n = state.ring_len[idx].long().clamp(0, L - 1)  # (m, nheads)
    ks = torch.arange(L)
    in_ring = ks < n[..., None]  # (m, nheads, L)
    now = ks == n[..., None]
    dts = torch.where(in_ring, state.ring_dt[idx], 0.0)
    xk = torch.where(in_ring[..., None], state.ring_x[idx].float(), 0.0)  # (m, h, L, head_dim)
    Bk = state.ring_B[idx].float().repeat_interleave(hpg, dim=1)  # (m, h, L, d_state)
    Bk = torch.where(in_ring[..., None], Bk, 0.0)
    append = isinstance(step, StateUpdateStep)
    if append:
        dt_now = torch.nn.functional.softplus(step.dt[live].float() + step.dt_bias)
        x_now = step.x[live].float()
        B_now = step.B[live].float().repeat_interleave(hpg, dim=1)
        dts = torch.where(now, dt_now[..., None], dts)
        xk = torch.where(now[..., None], x_now[:, :, None, :], xk)
        Bk = torch.where(now[..., None], B_now[:, :, None, :], Bk)
    after = dts.flip(-1).cumsum(-1).flip(-1) - dts
    w = dts * torch.exp(A[:, None] * after)  # (m, h, L)
    dec = torch.exp(A * dts.sum(-1))  # (m, h)
    cp = state.checkpoint[idx]
    if state.checkpoint_scale is None:
        s0 = cp.float()
    else:
        s0 = dequantize(cp, state.checkpoint_scale[idx])
    if append:
        Ch = step.C[live].float().repeat_interleave(hpg, dim=1)  # (m, h, d_state)
        bc = (Bk * Ch[:, :, None, :]).sum(-1)  # (m, h, L)
        y = dec[..., None] * (s0 @ Ch[..., None])[..., 0] + ((w * bc)[..., None] * xk).sum(2)
        y = y + step.D[:, None] * x_now
        if step.z is not None:
            y = y * torch.nn.functional.silu(step.z[live].float())
        step.out.zero_()
        step.out[live] = y.to(step.out.dtype)
    flush = (n == L - 1) if append else torch.ones_like(n, dtype=torch.bool)
    rows, heads = flush.nonzero(as_tuple=True)
    if rows.numel():
        s = dec[rows, heads, None, None] * s0[rows, heads] + torch.einsum(
            "rkp,rkn->rpn", w[rows, heads, :, None] * xk[rows, heads], Bk[rows, heads]
        )
        if state.checkpoint_scale is None:
            state.checkpoint[idx[rows], heads] = s.to(state.checkpoint.dtype)
        else:
            q, scale = quantize(s)
            state.checkpoint[idx[rows], heads] = q
            state.checkpoint_scale[idx[rows], heads] = scale
    if append:
        rows, heads = (~flush).nonzero(as_tuple=True)
        pos = n[rows, heads]
        state.ring_x[idx[rows], heads, pos] = step.x[live][rows, heads].to(state.ring_x.dtype)
        state.ring_dt[idx[rows], heads, pos] = dt_now[rows, heads]
        first = heads % hpg == 0
        rows, heads, pos = rows[first], heads[first], pos[first]
        groups = heads // hpg
        state.ring_B[idx[rows], groups, pos] = step.B[live][rows, groups].to(state.ring_B.dtype)
    new_len = torch.where(flush, 0, n + 1).to(torch.int32)
    state.ring_len[idx] = new_len
