"""The grouped RMSNorm written as its formula, one row and group at a time, in fp64 on the
CPU (the test oracle; production never calls it)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.rms_norm.args import GroupNorm


def _normalised(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return v / torch.sqrt((v * v).mean() + eps) * w


def group_rms_norm_reference(
    x: torch.Tensor, norm: GroupNorm, z: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Same result as ``group_rms_norm`` (see interface.py)."""
    xs, w = x.detach().cpu().double(), norm.weight.detach().cpu().double()
    group_size = norm.group_size
    if z is not None:
        xs = xs * torch.nn.functional.silu(z.detach().cpu().double())
    result = torch.empty_like(xs)
    for r in range(x.shape[0]):
        for start in range(0, x.shape[1], group_size):
            group = slice(start, start + group_size)
            result[r, group] = _normalised(xs[r, group], w[group], norm.eps)
    return out.copy_(result) if out is not None else result.to(x.device, x.dtype)
