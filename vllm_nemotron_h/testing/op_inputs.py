"""The ops' inputs laid out as the engine passes them, for the kernel tests and the benchmarks
alike: the activations are column views of one input-projection row ``[z | xbc | dt]``
(``xbc = [x | B | C]``), the states live in a slot cache with spare slots, and the rows'
slots are a random permutation (with vLLM's null slot 0 on one row when asked).

Every tensor is drawn from the one ``torch.Generator`` given, so a seed replays an input set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.state_format import quantize
from vllm_nemotron_h.ops.support import rank_heads_and_groups, tensor_parallel_split_problem
from vllm_nemotron_h.testing.checkpoints import REAL_SHAPES

NULL_SLOT = 0  # vLLM's null block


@dataclass(frozen=True)
class MambaShape:
    """One Mamba layer's per-rank sizes."""

    nheads: int
    head_dim: int
    d_state: int
    ngroups: int
    width: int = 4

    @classmethod
    def of_model(cls, model: str, tensor_parallel_size: int = 1) -> MambaShape:
        """One rank's shape of a real model of ``REAL_SHAPES``: its heads and groups split
        over ``tensor_parallel_size`` ranks as the plugin's mixer splits them (n_groups 1 is
        on every rank)."""
        s = REAL_SHAPES[model]
        heads, groups, tp = s["mamba_num_heads"], s["n_groups"], tensor_parallel_size
        problem = tensor_parallel_split_problem(heads, groups, tp)
        if problem:
            raise ValueError(f"{model} at tensor_parallel_size={tp}: {problem}")
        heads, groups = rank_heads_and_groups(heads, groups, tp)
        return cls(heads, s["mamba_head_dim"], s["ssm_state_size"], groups)

    @classmethod
    def distinct_models(cls) -> list[str]:
        """The first model of ``REAL_SHAPES`` for each Mamba layer shape (Nemotron 3 Super's
        is the 8B's): the kernel benchmarks' models."""
        first: dict[MambaShape, str] = {}
        for model in REAL_SHAPES:
            first.setdefault(cls.of_model(model), model)
        return list(first.values())

    @property
    def inner(self) -> int:
        return self.nheads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.ngroups * self.d_state

    @property
    def group_size(self) -> int:
        """Channels per group of the gated group norm."""
        return self.inner // self.ngroups


def record_of(cls: type, arguments: dict, **overrides: object):
    """The record ``cls`` (an op's argument dataclass) of the keyword ``arguments``, keys it
    has no field for left out, with ``overrides`` on top."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in {**arguments, **overrides}.items() if k in names})


class Draw:
    """Random tensors from one generator on one device."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.device = generator.device

    @classmethod
    def seeded(cls, seed: int, device: str | torch.device) -> Draw:
        return cls(torch.Generator(device=device).manual_seed(seed))

    def normal(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator, device=self.device).to(dtype)

    def decay(self, nheads: int) -> torch.Tensor:
        """A (negative) and well away from 0, as trained models have it."""
        return -self.normal(nheads).abs() - 0.1

    def slots(self, batch: int, num_slots: int, null_row: int | None) -> torch.Tensor:
        """``batch`` distinct int64 slots out of 1..num_slots-1; row ``null_row`` (if given)
        gets the null slot instead, as a padded row has it."""
        slots = torch.randperm(num_slots - 1, generator=self.generator, device=self.device)
        slots = slots[:batch] + 1
        if null_row is not None and batch:
            slots[null_row] = NULL_SLOT
        return slots


def projection(draw: Draw, shape: MambaShape, batch: int, act: torch.dtype) -> dict:
    """z (batch, inner), xbc (batch, conv_dim) and dt (batch, nheads): views of one
    projection row each, with its strides."""
    s = shape
    row = draw.normal(batch, s.inner + s.conv_dim + s.nheads, dtype=act)
    z, xbc, dt = torch.split(row, [s.inner, s.conv_dim, s.nheads], dim=-1)
    return dict(z=z, xbc=xbc, dt=dt)


def ssm_state_cache(draw: Draw, num_slots: int, shape: MambaShape, dtype: torch.dtype) -> dict:
    """``state`` (num_slots, nheads, head_dim, d_state) of ``dtype`` and ``state_scale``: the
    per-row scales of an int8 state (ops/state_format.py), None for the others."""
    values = draw.normal(num_slots, shape.nheads, shape.head_dim, shape.d_state)
    if dtype == torch.int8:
        state, scale = quantize(values)
        return dict(state=state, state_scale=scale)
    return dict(state=values.to(dtype), state_scale=None)


def head_params(draw: Draw, nheads: int) -> dict:
    """A, D and dt_bias (nheads,) fp32."""
    return dict(A=draw.decay(nheads), D=draw.normal(nheads), dt_bias=draw.normal(nheads) * 0.5)


def conv_state_cache(
    draw: Draw,
    num_slots: int,
    conv_dim: int,
    width: int,
    dtype: torch.dtype,
    dim_first: bool,
    draft_tokens: int = 0,
) -> torch.Tensor:
    """(num_slots, conv_dim, width - 1 + draft_tokens) (vLLM's conv state under speculative
    decoding holds a column per draft token more); ``dim_first=False`` is vLLM's "SD" layout
    seen transposed (the window dimension contiguous across channels)."""
    columns = width - 1 + draft_tokens
    if dim_first:
        return draw.normal(num_slots, conv_dim, columns, dtype=dtype)
    return draw.normal(num_slots, columns, conv_dim, dtype=dtype).transpose(-1, -2)


def conv_inputs(
    draw: Draw,
    conv_dim: int,
    width: int,
    batch: int,
    dtype: torch.dtype,
    *,
    bias: bool = True,
    dim_first: bool = True,
    spare_slots: int = 2,
    null_row: int | None = -1,
) -> dict:
    """The conv update's keyword arguments (``state_slots`` included): x rows strided as a
    slice of the projection row."""
    num_slots = batch + spare_slots
    return dict(
        x=draw.normal(batch, conv_dim + 8, dtype=dtype)[:, 4 : 4 + conv_dim],
        conv_state=conv_state_cache(draw, num_slots, conv_dim, width, dtype, dim_first),
        weight=draw.normal(conv_dim, width, dtype=dtype) * 0.5,
        bias=draw.normal(conv_dim, dtype=dtype) if bias else None,
        state_slots=draw.slots(batch, num_slots, null_row),
    )


def group_norm_inputs(draw: Draw, shape: MambaShape, batch: int, act: torch.dtype) -> dict:
    """y (batch, inner), the gate z (a projection view) and the norm weight."""
    return dict(
        x=draw.normal(batch, shape.inner, dtype=act),
        z=projection(draw, shape, batch, act)["z"],
        weight=draw.normal(shape.inner, dtype=act),
    )


@dataclass(frozen=True)
class LayerCase:
    """A Mamba layer's inputs for ``batch`` sequences, drawn from ``draw``: the state update's
    (``ssu``), the deferred update's (``deferred``) or the decode tail's (``decode``). The rows'
    slots are distinct, with ``spare_slots`` more slots in the cache and vLLM's null slot on
    row ``null_row`` (None: every row live); an int8 ``state_dtype`` gives an int8 state with
    its scales."""

    draw: Draw
    shape: MambaShape
    batch: int
    state_dtype: torch.dtype
    act: torch.dtype
    spare_slots: int = 3
    null_row: int | None = 0

    @property
    def num_slots(self) -> int:
        return self.batch + self.spare_slots

    def slots(self) -> torch.Tensor:
        return self.draw.slots(self.batch, self.num_slots, self.null_row)

    def ssu(self, gate: bool = True, strided: bool = True) -> dict:
        """The state update's keyword arguments (``state_slots`` and ``state_scale``
        included, ``null_slot`` not): x, B, C, z and dt as views of a projection row
        (``strided``) or each contiguous."""
        draw, s, batch, act = self.draw, self.shape, self.batch, self.act
        if strided:
            row = projection(draw, s, batch, act)
            x, B, C = split_xbc(row["xbc"], s.nheads, s.head_dim, s.d_state)
            z, dt = row["z"].view(batch, s.nheads, s.head_dim), row["dt"]
        else:
            x = draw.normal(batch, s.nheads, s.head_dim, dtype=act)
            z = draw.normal(batch, s.nheads, s.head_dim, dtype=act)
            B = draw.normal(batch, s.ngroups, s.d_state, dtype=act)
            C = draw.normal(batch, s.ngroups, s.d_state, dtype=act)
            dt = draw.normal(batch, s.nheads, dtype=act)
        return dict(
            **ssm_state_cache(draw, self.num_slots, s, self.state_dtype),
            x=x,
            dt=dt,
            B=B,
            C=C,
            z=z if gate else None,
            state_slots=self.slots(),
            **head_params(draw, s.nheads),
        )

    def deferred(self, ring_size: int, gate: bool = True, strided: bool = True) -> dict:
        """The deferred state update's inputs: ``ssu``'s with its state as a
        ``DeferredState`` whose checkpoints are that state, rings full of tokens and each
        slot at a random ring length (the same for all heads of a slot, as the engine keeps
        them)."""
        t = self.ssu(gate, strided)
        draw, s, L = self.draw, self.shape, ring_size
        num_slots = self.num_slots
        lengths = torch.randint(L, (num_slots, 1), generator=draw.generator, device=draw.device)
        t["state"] = DeferredState(
            checkpoint=t["state"],
            checkpoint_scale=t.pop("state_scale"),
            ring_x=draw.normal(num_slots, s.nheads, L, s.head_dim, dtype=self.act),
            ring_dt=draw.normal(num_slots, s.nheads, L).abs() * 0.5,
            ring_B=draw.normal(num_slots, s.ngroups, L, s.d_state, dtype=self.act),
            ring_len=lengths.expand(num_slots, s.nheads).to(torch.int32).contiguous(),
        )
        return t

    def decode(self, bias: bool = True, dim_first: bool = True) -> dict:
        """The decode tail's keyword arguments (``state_slots`` and ``ssm_scale`` included,
        no workspace); ``dim_first``: the conv state's layout (``conv_state_cache``)."""
        draw, s, batch, act = self.draw, self.shape, self.batch, self.act
        conv_state = conv_state_cache(draw, self.num_slots, s.conv_dim, s.width, act, dim_first)
        ssm = ssm_state_cache(draw, self.num_slots, s, self.state_dtype)
        return dict(
            **projection(draw, s, batch, act),
            conv_state=conv_state,
            conv_weight=draw.normal(s.conv_dim, s.width, dtype=act) * 0.5,
            conv_bias=draw.normal(s.conv_dim, dtype=act) if bias else None,
            ssm_state=ssm["state"],
            ssm_scale=ssm["state_scale"],
            norm_weight=draw.normal(s.inner, dtype=act),
            state_slots=self.slots(),
            **head_params(draw, s.nheads),
        )

    def speculative(
        self, max_tokens: int, bias: bool = True, dim_first: bool = True, full: bool = False
    ) -> dict:
        """The speculative decode tail's keyword arguments for ``batch`` sequences of 1 to
        ``max_tokens`` tokens each (``full``: all ``max_tokens``, a step in which every row
        verifies its drafts): ``decode``'s with ``max_tokens`` distinct slots per row (null
        slots on row ``null_row``), query starts, accepted counts 1..max_tokens and a conv
        state with a column per draft token more."""
        draw, s, rows, act, K = self.draw, self.shape, self.batch, self.act, max_tokens
        gen, dev = draw.generator, draw.device
        lens = torch.randint(1, K + 1, (rows,), generator=gen, device=dev)
        if full:
            lens.fill_(K)
        query_start = torch.zeros(rows + 1, dtype=torch.int64, device=dev)
        query_start[1:] = torch.cumsum(lens, 0)
        num_slots = rows * K + self.spare_slots
        slots = draw.slots(rows * K, num_slots, None).view(rows, K)
        if self.null_row is not None:
            slots[self.null_row] = NULL_SLOT
        ssm = ssm_state_cache(draw, num_slots, s, self.state_dtype)
        return dict(
            **projection(draw, s, int(query_start[-1]), act),
            conv_state=conv_state_cache(
                draw, num_slots, s.conv_dim, s.width, act, dim_first, draft_tokens=K - 1
            ),
            conv_weight=draw.normal(s.conv_dim, s.width, dtype=act) * 0.5,
            conv_bias=draw.normal(s.conv_dim, dtype=act) if bias else None,
            ssm_state=ssm["state"],
            ssm_scale=ssm["state_scale"],
            norm_weight=draw.normal(s.inner, dtype=act),
            state_slots=slots,
            query_start=query_start,
            num_accepted=torch.randint(1, K + 1, (rows,), generator=gen, device=dev),
            **head_params(draw, s.nheads),
        )


def slot_copy_inputs(
    draw: Draw,
    per_slot: tuple[int, ...],
    rows: int,
    state_dtype: torch.dtype,
    *,
    spare_slots: int = 8,
    slot_pad: int = 0,
) -> dict:
    """A prefill's final states (``values``), a state cache with spare slots whose slots lie
    ``slot_pad`` elements apart (as vLLM's views into a shared buffer can), int64 slots and
    the has-initial-state flags (every row: the gather's worst case)."""
    num_slots = rows + spare_slots
    n = int(torch.tensor(per_slot).prod())
    flat = draw.normal(num_slots, n + slot_pad, dtype=state_dtype)
    order = torch.randperm(num_slots, generator=draw.generator, device=draw.device)
    return dict(
        state=flat[:, :n].view(num_slots, *per_slot),
        slots=order[:rows],
        values=draw.normal(rows, *per_slot, dtype=state_dtype),
        has_initial=torch.ones(rows, dtype=torch.bool, device=draw.device),
    )


def prefill_chunks(lengths: list[int], chunk_size: int, device: str | torch.device):
    """vLLM's prefill metadata of prompts of ``lengths`` tokens with no tokens before them,
    as its chunked scan reads it (int32): query_start_loc_p, and each sequence cut into chunks
    of ``chunk_size`` (seq_idx_p, cu_chunk_seqlen_p, last_chunk_indices_p)."""
    cu_chunks, seq_idx, last, start = [0], [], [], 0
    for row, n in enumerate(lengths):
        for first in range(0, n, chunk_size):
            cu_chunks.append(start + min(first + chunk_size, n))
            seq_idx.append(row)
        last.append(len(seq_idx) - 1)
        start += n
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)

    def as_int32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return SimpleNamespace(
        chunk_size=chunk_size,
        query_start_loc_p=as_int32(starts),
        seq_idx_p=as_int32(seq_idx),
        cu_chunk_seqlen_p=as_int32(cu_chunks),
        last_chunk_indices_p=as_int32(last),
    )
