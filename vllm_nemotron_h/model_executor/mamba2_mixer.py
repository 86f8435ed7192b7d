"""The Mamba2 mixer: vLLM's ``MambaMixer2`` (projections, TP sharding, weight loading, state
shapes) with the conv + SSM + gate + norm part replaced.

Per step, inside vLLM's ``vllm::mamba_mixer2`` op (a CUDA-graph split point):
    prefill rows: vLLM's causal_conv1d_fn and chunked scan, without the gate (CPU ops on CPU),
                  then group_rms_norm with the silu(z) gate, no rstd stored (vLLM's scan with
                  z took 5x longer: 807 vs 155 us per 128-token prefill of Nemotron-H 8B on
                  the H100, step_profile.py); initial and final SSM states move between
                  the state cache and the scan through the rows' slots (state_slot_copy)
    decode rows:  mamba2_decode: conv update -> state update (softplus, A, D, silu(z) in fp32
                  registers) -> group norm, in one launch up to batch x heads 1024 and as
                  three kernels above, through the int64 state slots of ``state_slots``
    When the norm's one group spans tensor-parallel ranks, the decode kernel leaves the norm
    out and all rows are normalised here with an all-reduced sum of squares.
"""

from __future__ import annotations

import torch
from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn
from vllm.model_executor.layers.mamba.ops.ssd_combined import (
    mamba_chunk_scan_combined_varlen,
)
from vllm.model_executor.model_loader.weight_utils import sharded_weight_loader
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils.torch_utils import _encode_layer_name

from vllm_nemotron_h.compat import NULL_BLOCK_ID, prefill_checkpoint, store_prefill_checkpoint
from vllm_nemotron_h.kernels import (
    gather_state_slots,
    group_rms_norm,
    mamba2_decode,
    scatter_state_slots,
)
from vllm_nemotron_h.model_executor.state_slots import StateSlotsMamba2Backend, StateSlotsMetadata


class PluginMambaMixer2(MambaMixer2):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # D and dt_bias live in fp32, as the kernels read them (vLLM keeps the model dtype);
        # A is already -exp(A_log) in fp32 from vLLM's loader.
        for name in ("D", "dt_bias"):
            param = torch.nn.Parameter(
                torch.ones(self.num_heads // self.tp_size, dtype=torch.float32)
            )
            set_weight_attrs(param, {"weight_loader": sharded_weight_loader(0)})
            setattr(self, name, param)
        self.tped_heads = self.num_heads // self.tp_size
        self.tped_groups = self.n_groups // self.tp_size
        self.group_size = self.intermediate_size // kwargs["n_groups"]
        # n_groups == 1 under TP: the one group spans ranks, its sum of squares is all-reduced.
        # vLLM's conv-state layout is fixed for the process: read it once, not per layer and step.
        self.conv_state_dim_first = is_conv_state_dim_first()
        self.norm_spans_ranks = self.tp_size > 1 and kwargs["n_groups"] == 1
        self.decode_args_checked = False

    def get_attn_backend(self) -> type[StateSlotsMamba2Backend]:
        return StateSlotsMamba2Backend

    def forward(self, hidden_states: torch.Tensor, mup_vector: torch.Tensor | None = None):
        projected_states, _ = self.in_proj(hidden_states)
        ssm_output = torch.empty(
            hidden_states.shape[0],
            self.tped_intermediate_size,
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        # vLLM's op (a graph split point) calls back into self.conv_ssm_forward.
        torch.ops.vllm.mamba_mixer2(projected_states, ssm_output, _encode_layer_name(self.prefix))
        output, _ = self.out_proj(ssm_output)
        return output

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor) -> None:
        metadata = get_forward_context().attn_metadata
        metadata = metadata.get(self.prefix) if metadata is not None else None
        if metadata is None:
            # Profile run: let vLLM autotune its prefill kernels while memory is free.
            self._warmup_ssd_kernels(projected_states)
            return
        assert isinstance(metadata, StateSlotsMetadata)
        conv_state = (
            self.kv_cache[0] if self.conv_state_dim_first else self.kv_cache[0].transpose(-1, -2)
        )
        ssm_state = self.kv_cache[1]

        n_dec = metadata.num_decode_tokens
        n_all = n_dec + metadata.num_prefill_tokens
        gate = projected_states[:n_all, : self.tped_intermediate_size]
        xbc, dt = torch.split(
            projected_states[:n_all, self.tped_intermediate_size :],
            [self.tped_conv_size, self.tped_dt_size],
            dim=-1,
        )
        if metadata.num_prefills > 0:
            self._prefill(
                metadata,
                xbc[n_dec:],
                dt[n_dec:],
                output[n_dec:n_all],
                conv_state,
                ssm_state,
            )
        if n_dec > 0:
            self._decode(
                metadata,
                xbc[:n_dec],
                dt[:n_dec],
                gate[:n_dec],
                output[:n_dec],
                conv_state,
                ssm_state,
            )
        if self.norm_spans_ranks and n_dec > 0:
            self._norm_in_place(output[:n_dec])  # gated in the decode kernel already
        if metadata.num_prefills > 0:
            self._norm_in_place(output[n_dec:n_all], gate[n_dec:])

    def _prefill(self, md, xbc, dt, out, conv_state, ssm_state) -> None:
        n = xbc.shape[0]
        xbc_t = xbc.transpose(0, 1)
        checkpoint_idx, checkpoint_meta = prefill_checkpoint(md)
        xbc = causal_conv1d_fn(
            xbc_t,
            self.conv_weights,
            self.conv1d.bias,
            activation=self.activation,
            conv_states=conv_state,
            has_initial_state=md.has_initial_states_p,
            cache_indices=md.state_indices_tensor_p,
            metadata=md,
            query_start_loc=md.query_start_loc_p,
        ).transpose(0, 1)[:n]
        x, B, C = self.split_hidden_states_B_C_fn(xbc)
        initial_states = None
        if md.has_initial_states_p is not None and md.prep_initial_states:
            initial_states = gather_state_slots(
                ssm_state, md.state_indices_tensor_p, md.has_initial_states_p
            )
        # vLLM's CPU scan returns only the final state of each sequence, not per chunk.
        per_chunk = checkpoint_idx is not None and xbc.is_cuda
        final_states = self._scan(
            md,
            x,
            B,
            C,
            dt,
            out,
            initial_states,
            ssm_state.dtype,
            per_chunk,
            md.query_start_loc_p,
            (md.seq_idx_p, md.cu_chunk_seqlen_p, md.last_chunk_indices_p),
        )
        if checkpoint_idx is not None:
            # vLLM 0.32 prefix caching: keep the states at block boundaries for later hits.
            if per_chunk:
                chunk_states = final_states
                final_states = final_states[md.last_chunk_indices_p]
            else:
                chunk_states = self._cpu_checkpoint_states(
                    md, checkpoint_meta, x, B, C, dt, initial_states, ssm_state.dtype
                )
                checkpoint_idx = torch.arange(chunk_states.shape[0])
            store_prefill_checkpoint(
                checkpoint_meta,
                checkpoint_idx,
                xbc_t,
                conv_state,
                chunk_states,
                ssm_state,
                md.query_start_loc_p,
                state_len=self.conv_kernel_size - 1,
            )
        scatter_state_slots(ssm_state, md.state_indices_tensor_p, final_states)

    def _scan(
        self, md, x, B, C, dt, out, initial_states, state_dtype, per_chunk, cu_seqlens, chunks
    ) -> torch.Tensor:
        """vLLM's chunked scan (its CPU op on CPU), without the gate."""
        n = x.shape[0]
        seq_idx, cu_chunk_seqlens, last_chunk_indices = chunks
        return mamba_chunk_scan_combined_varlen(
            x.view(n, self.tped_heads, self.head_dim),
            dt,
            self.A,
            B.view(n, self.tped_groups, -1),
            C.view(n, self.tped_groups, -1),
            chunk_size=md.chunk_size,
            D=self.D,
            dt_bias=self.dt_bias,
            seq_idx=seq_idx,
            cu_seqlens=cu_seqlens,
            cu_chunk_seqlens=cu_chunk_seqlens,
            last_chunk_indices=last_chunk_indices,
            initial_states=initial_states,
            dt_softplus=True,
            dt_limit=(0.0, float("inf")),
            out=out.view(n, self.tped_heads, self.head_dim),
            state_dtype=state_dtype,
            return_intermediate_states=per_chunk,
        )

    def _cpu_checkpoint_states(self, md, meta, x, B, C, dt, initial_states, state_dtype):
        """The state of each prefill row after its checkpoint offset, one per row (zeros where
        the row stores none), by scanning each row's tokens up to that offset once more."""
        offsets = meta.checkpoint_offsets.tolist()
        starts = md.query_start_loc_p.tolist()
        rows = [r for r, off in enumerate(offsets) if off > 0]
        states = torch.zeros(
            len(offsets), self.tped_heads, self.head_dim, self.ssm_state_size, dtype=state_dtype
        )
        if not rows:
            return states
        tokens = torch.cat([torch.arange(starts[r], starts[r] + offsets[r]) for r in rows])
        cu = torch.tensor([0] + [offsets[r] for r in rows]).cumsum(0).to(torch.int32)
        init = initial_states[rows] if initial_states is not None else None
        scratch = torch.empty(len(tokens), self.tped_heads * self.head_dim, dtype=x.dtype)
        states[rows] = self._scan(
            md,
            x[tokens],
            B[tokens],
            C[tokens],
            dt[tokens],
            scratch,
            init,
            state_dtype,
            False,
            cu,
            # The CPU scan reads only cu_seqlens; the wrapper insists on chunk metadata.
            (torch.zeros(len(rows), dtype=torch.int32), cu, torch.arange(len(rows))),
        )
        return states

    def _decode(self, md, xbc, dt, gate, out, conv_state, ssm_state) -> None:
        # The first decode step checks every argument; later steps skip the checks (~30 us of
        # host time per layer in eager and mixed steps; CUDA-graph replays run no Python):
        # the state cache, the weights and the views' layout stay the same, only the batch
        # changes, and the launch still checks the workspace against it.
        mamba2_decode(
            xbc,
            dt,
            gate,
            conv_state,
            self.conv_weights,
            self.conv1d.bias,
            ssm_state,
            self.A,
            self.D,
            self.dt_bias,
            norm_weight=None if self.norm_spans_ranks else self.norm.weight,
            eps=self.norm.variance_epsilon,
            workspace=md.decode_workspace,
            state_slots=md.state_slots_d[: xbc.shape[0]],
            null_slot=NULL_BLOCK_ID,
            out=out,
            check=not self.decode_args_checked,
        )
        self.decode_args_checked = True

    def _norm_in_place(self, y: torch.Tensor, gate: torch.Tensor | None = None) -> None:
        """Group RMSNorm of ``y`` in place, gated by silu(``gate``) first when given."""
        eps = self.norm.variance_epsilon
        if not self.norm_spans_ranks:
            group_rms_norm(y, self.norm.weight, self.group_size, eps, z=gate, out=y)
            return
        yf = y.float()
        if gate is not None:
            yf = yf * torch.nn.functional.silu(gate.float())
        sum_sq = tensor_model_parallel_all_reduce(yf.pow(2).sum(-1, keepdim=True))
        rstd = torch.rsqrt(sum_sq / (y.shape[-1] * self.tp_size) + eps)
        y.copy_(yf * rstd * self.norm.weight.float())
