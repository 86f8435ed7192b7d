"""The state update with deferred writes written as its definition, one sequence and head at
a time, in fp64 on the CPU (the test oracle; production never calls it): the checkpoint is
advanced through the ring token by token with the per-step recurrence, then by the new token;
the ring is written back when it is full."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState, RingFlush
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.state_format import dequantize, quantize


def _state_now(state: DeferredState, slot: int, h: int, g: int, A: float) -> torch.Tensor:
    """The (head_dim, d_state) state of ``slot``'s head ``h``: its checkpoint advanced through
    the tokens in its ring, in fp64."""
    cp = state.checkpoint[slot, h].cpu()
    if state.checkpoint_scale is None:
        s = cp.double()
    else:
        s = dequantize(cp, state.checkpoint_scale[slot, h].cpu().double())
    n = ring_length(state, slot, h)
    for k in range(n):
        dt_k = float(state.ring_dt[slot, h, k])
        x_k = state.ring_x[slot, h, k].cpu().double()
        B_k = state.ring_B[slot, g, k].cpu().double()
        decay = torch.exp(torch.tensor(A * dt_k, dtype=torch.float64))
        s = s * decay + dt_k * torch.outer(x_k, B_k)
    return s


def ring_length(state: DeferredState, slot: int, h: int) -> int:
    """The head's ring length, clamped to the ring as the kernel reads it."""
    return min(max(int(state.ring_len[slot, h]), 0), state.ring_size - 1)


def _write_back(state: DeferredState, slot: int, h: int, s: torch.Tensor) -> None:
    if state.checkpoint_scale is None:
        state.checkpoint[slot, h] = s.to(state.checkpoint.dtype)
    else:
        q, scale = quantize(s)
        state.checkpoint[slot, h] = q
        state.checkpoint_scale[slot, h] = scale.to(torch.float32)
    state.ring_len[slot, h] = 0


def deferred_state_update_reference(state: DeferredState, step: StateUpdateStep) -> torch.Tensor:
    """Same effects as ``deferred_state_update`` (see interface.py); returns the output
    (``step.out`` when given)."""
    x, dt, A, B, C, D, dt_bias, z = (
        step.x, step.dt, step.A, step.B, step.C, step.D, step.dt_bias, step.z
    )  # fmt: skip
    batch, nheads, head_dim = x.shape
    heads_per_group = nheads // B.shape[1]
    L = state.ring_size
    y = torch.zeros(batch, nheads, head_dim, dtype=torch.float64)
    for b in range(batch):
        slot = int(step.state_slots[b]) if step.state_slots is not None else b
        if slot == step.null_slot:
            continue
        for h in range(nheads):
            g = h // heads_per_group
            a = float(A[h])
            s = _state_now(state, slot, h, g, a)
            dt_h = torch.nn.functional.softplus(dt[b, h].double().cpu() + float(dt_bias[h]))
            x_h, B_g = x[b, h].cpu().double(), B[b, g].cpu().double()
            s = s * torch.exp(a * dt_h) + dt_h * torch.outer(x_h, B_g)
            y[b, h] = s @ C[b, g].cpu().double() + float(D[h]) * x_h
            if z is not None:
                y[b, h] *= torch.nn.functional.silu(z[b, h].cpu().double())
            n = ring_length(state, slot, h)
            if n == L - 1:
                _write_back(state, slot, h, s)
                continue
            state.ring_x[slot, h, n] = x[b, h]
            state.ring_dt[slot, h, n] = dt_h.float()
            if h % heads_per_group == 0:
                state.ring_B[slot, g, n] = B[b, g]
            state.ring_len[slot, h] = n + 1
    out = step.out if step.out is not None else torch.empty_like(x)
    return out.copy_(y)


def flush_deferred_state_reference(state: DeferredState, flush: RingFlush) -> None:
    """Same effects as ``flush_deferred_state`` (see interface.py)."""
    nheads = state.checkpoint.shape[1]
    heads_per_group = nheads // state.ring_B.shape[1]
    for slot in flush.state_slots.tolist():
        if slot == flush.null_slot:
            continue
        for h in range(nheads):
            s = _state_now(state, slot, h, h // heads_per_group, float(flush.A[h]))
            _write_back(state, slot, h, s)
