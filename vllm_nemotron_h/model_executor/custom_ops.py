"""The plugin's RMSNorm: on GPUs vLLM builds it wherever its Nemotron-H asks for an ``RMSNorm``
(vllm_boundary.layers.plugin_layers), and its kernels run as opaque torch ops inside
torch.compile'd graphs. (The Mamba2 decode kernels need no op of their own: they run inside
vLLM's ``vllm::mamba_mixer2`` op, a graph split point, which is opaque already.)"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.rms_norm import rms_norm
from vllm_nemotron_h.vllm_boundary.layers import RMSNorm


@torch.library.custom_op("vllm_nemotron_h::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm(x, weight, eps)


@rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("vllm_nemotron_h::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm(x, weight, eps, residual)


@fused_add_rms_norm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    return torch.empty_like(x), torch.empty_like(x)


class PluginRMSNorm(RMSNorm):
    """vLLM's ``RMSNorm`` (its weight, loading and constructor) with the plugin's kernel:
    ``norm(x)`` or ``norm(x, residual) -> (normed, x + residual)``."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm_op(x, self.weight, self.variance_epsilon)
        return fused_add_rms_norm_op(x, residual, self.weight, self.variance_epsilon)
