"""The kernels that run inside torch.compile'd graphs, registered as opaque torch ops.

Only the layer norms need this: the Mamba2 decode kernels run inside vLLM's
``vllm::mamba_mixer2`` op (a graph split point), which is opaque already.
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.kernels.rms_norm import rms_norm


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


class RMSNorm(torch.nn.Module):
    """Drop-in for vLLM's ``RMSNorm`` in the decoder layers: ``norm(x)`` or
    ``norm(x, residual) -> (normed, x + residual)``, through the project's kernel."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm_op(x, self.weight, self.variance_epsilon)
        return fused_add_rms_norm_op(x, residual, self.weight, self.variance_epsilon)
