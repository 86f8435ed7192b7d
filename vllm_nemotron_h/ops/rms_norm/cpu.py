"""The CPU serving path of the grouped RMSNorm: whole-tensor PyTorch, fp32 math."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.rms_norm.args import GroupNorm


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
