"""Grouped RMSNorm, inference only.

``group_rms_norm(x, weight, group_size, eps, z, out)`` normalises each contiguous group of
``group_size`` channels on its own (Mamba2's gated norm with ``n_groups`` groups); with a
gate ``z`` the input is ``x * silu(z)`` first (the prefill path; decode gates in the state
update already). ``out`` may be ``x`` itself (in place: each program reads its group before
it writes it), which saves the model a copy per Mamba layer.

    out = g * rsqrt(mean(g^2) + eps) * weight    for each group g of x (or of x * silu(z))

Shapes: x, z, out (tokens, hidden), weight (hidden,); any float dtype, math in fp32.
Inference mode: nothing but the outputs is allocated or written (no rstd). The model's other
RMSNorms are vLLM's, fused by torch.compile with the residual add around them.
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.rms_norm import kernel
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.support import ACTIVATION_DTYPES, check_tensor, use_triton


def _check_rows(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if like is None:
        check_tensor(name, t, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    else:
        check_tensor(name, t, tuple(like.shape), ACTIVATION_DTYPES, like.device, True)


def check_group(
    x: torch.Tensor, norm: GroupNorm, z: torch.Tensor | None, out: torch.Tensor | None
) -> None:
    """Raises ValueError naming the first argument of ``group_rms_norm`` that does not fit."""
    _check_rows("x", x)
    hidden = x.shape[1]
    check_tensor("weight", norm.weight, (hidden,), ACTIVATION_DTYPES, x.device)
    if norm.group_size <= 0 or hidden % norm.group_size:
        raise ValueError(f"group_size must divide the hidden size {hidden}, got {norm.group_size}")
    if z is not None:
        _check_rows("z", z, x)
    if out is not None:
        _check_rows("out", out, x)
        if out.dtype != x.dtype:
            raise ValueError(f"out must have x's dtype {x.dtype}, got {out.dtype}")


def group_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    eps: float,
    z: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Normalises each group of ``group_size`` channels; gates with silu(z) first if given.
    Writes into ``out`` when given (``x`` itself is allowed) and returns it."""
    norm = GroupNorm(weight, group_size, eps)
    check_group(x, norm, z, out)
    if not use_triton(x):
        return group_rms_norm_cpu(x, norm, z, out)
    return kernel.launch_group(x, norm, z, out)
