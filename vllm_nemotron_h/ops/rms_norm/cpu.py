"""The CPU serving paths of RMSNorm and grouped RMSNorm: whole-tensor PyTorch, fp32 math."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.rms_norm.args import GroupNorm


def rms_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and results as the interface's ``rms_norm``; no checks."""
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return (out, x) if residual is not None else out


def group_rms_norm_cpu(
    x: torch.Tensor, norm: GroupNorm, z: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Same result as the interface's ``group_rms_norm``; no checks."""
    xf = x.float()
    if z is not None:
        xf = xf * torch.nn.functional.silu(z.float())
    g = xf.view(*x.shape[:-1], x.shape[-1] // norm.group_size, norm.group_size)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + norm.eps)
    normed = (g.view(x.shape) * norm.weight.float()).to(x.dtype)
    return normed if out is None else out.copy_(normed)
