"""Nemotron-H MoE layers on CPU, where vLLM's FusedMoE refuses non-gated relu2 experts.

Routing follows the checkpoint's config exactly (sigmoid scores, e_score_correction_bias for
the choice, grouped top-k, renormalised weights times routed_scaling_factor). Each expert is
vLLM's ``NemotronHMLP`` (column/row-parallel, so tensor parallel works); every expert runs
on every token and is weighted by its routing weight (zero when not chosen): no
data-dependent shapes, which keeps the layer compilable. That costs n_experts times the
expert FLOPs, acceptable for the small checkpoints served on CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm_nemotron_h.vllm_boundary.layers import (
    GateLinear,
    NemotronHMLP,
    NemotronHMoEDecoderLayer,
    ReplicatedLinear,
    RMSNorm,
    all_reduce,
    bare_module_init,
    tensor_parallel_size,
)


def route(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids), each (tokens, top_k), as the HF reference routes."""
    scores = router_logits.float().sigmoid()
    choice = scores + correction_bias.float()
    n_exp = choice.shape[-1]
    group_scores = choice.view(-1, n_group, n_exp // n_group).topk(2, dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    expert_mask = group_mask.unsqueeze(-1).expand(-1, n_group, n_exp // n_group).reshape(-1, n_exp)
    choice = choice.masked_fill(expert_mask == 0, float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scale, ids


class CpuNemotronHMoE(nn.Module):
    def __init__(self, config, quant_config=None, parallel_config=None, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.tp_size = tensor_parallel_size()
        # The attributes vLLM's MixtureOfExperts bookkeeping reads (no EPLB on CPU).
        self.n_routed_experts = config.n_routed_experts
        self.n_shared_experts = config.n_shared_experts or 0
        self.n_logical_experts = self.n_physical_experts = self.n_routed_experts
        self.n_local_physical_experts = self.n_routed_experts
        self.n_redundant_experts = 0

        self.gate = GateLinear(
            config.hidden_size,
            config.n_routed_experts,
            out_dtype=torch.float32,
            force_fp32_compute=True,
            prefix=f"{prefix}.gate",
        )
        self.gate.e_score_correction_bias = nn.Parameter(
            torch.zeros(config.n_routed_experts, dtype=torch.float32)
        )
        # Latent MoE (moe_latent_size): the routed experts work in a narrower projection of
        # the hidden state, projected in and out by replicated linear layers; the router and
        # the shared experts see the hidden state itself.
        latent = getattr(config, "moe_latent_size", None)
        self.fc1_latent_proj = self.fc2_latent_proj = None
        if latent is not None:
            self.fc1_latent_proj, self.fc2_latent_proj = (
                ReplicatedLinear(
                    input_size=n_in,
                    output_size=n_out,
                    bias=config.mlp_bias,
                    quant_config=quant_config,
                    prefix=f"{prefix}.{name}",
                )
                for name, n_in, n_out in (
                    ("fc1_latent_proj", config.hidden_size, latent),
                    ("fc2_latent_proj", latent, config.hidden_size),
                )
            )
        self.experts = nn.ModuleList(
            NemotronHMLP(
                config,
                hidden_size=config.hidden_size if latent is None else latent,
                intermediate_size=config.moe_intermediate_size,
                quant_config=quant_config,
                bias=config.mlp_bias,
                reduce_results=False,
                prefix=f"{prefix}.experts.{i}",
            )
            for i in range(config.n_routed_experts)
        )
        self.shared_experts = None
        if self.n_shared_experts:
            self.shared_experts = NemotronHMLP(
                config,
                hidden_size=config.hidden_size,
                intermediate_size=config.moe_shared_expert_intermediate_size
                * self.n_shared_experts,
                quant_config=quant_config,
                bias=config.mlp_bias,
                reduce_results=False,
                prefix=f"{prefix}.shared_experts",
            )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        router_logits, _ = self.gate(hidden_states)
        weights, ids = route(
            router_logits,
            self.gate.e_score_correction_bias,
            cfg.num_experts_per_tok,
            cfg.n_group,
            cfg.topk_group,
            cfg.norm_topk_prob,
            cfg.routed_scaling_factor,
        )
        routed_in = hidden_states
        if self.fc1_latent_proj is not None:
            routed_in = self.fc1_latent_proj(hidden_states)[0]
        out = torch.zeros(routed_in.shape, dtype=torch.float32, device=routed_in.device)
        for e, expert in enumerate(self.experts):
            w = (weights * (ids == e)).sum(-1, keepdim=True)
            out = out + expert(routed_in).float() * w
        out = out.to(hidden_states.dtype)
        if self.fc2_latent_proj is not None:
            # the ranks' partial sums are added first, so that the projection's bias counts once
            out = self.fc2_latent_proj(all_reduce(out) if self.tp_size > 1 else out)[0]
            if self.shared_experts is None:
                return out
            shared = self.shared_experts(hidden_states)
            return out + (all_reduce(shared) if self.tp_size > 1 else shared)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        return all_reduce(out) if self.tp_size > 1 else out


class CpuNemotronHMoEDecoderLayer(NemotronHMoEDecoderLayer):
    """vLLM's MoE decoder layer (its forward, and the type vLLM's model counts MoE layers
    by) built around ``CpuNemotronHMoE``."""

    def __init__(
        self,
        config,
        layer_idx: int,
        model_config=None,
        cache_config=None,
        quant_config=None,
        parallel_config=None,
        prefix: str = "",
    ) -> None:
        bare_module_init(self)  # vLLM's __init__ would build the FusedMoE CPU refuses
        self.config = config
        # Heterogeneous (Puzzle) configs give each layer its own fields, as in vLLM's layer.
        layer_config = getattr(config, "get_nemotron_h_config_for_layer", None)
        moe_config = layer_config(layer_idx) if layer_config else config
        self.mixer = CpuNemotronHMoE(moe_config, quant_config, parallel_config, f"{prefix}.mixer")
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
