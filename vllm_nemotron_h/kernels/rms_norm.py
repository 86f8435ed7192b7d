"""RMSNorm (optionally fused with the residual add) and grouped RMSNorm, inference only.

``rms_norm(x, weight, eps, residual)``::

    r   = x + residual                 (rounded to x.dtype; returned as the new residual)
    out = r * rsqrt(mean(r^2) + eps) * weight

``group_rms_norm(x, weight, group_size, eps, z, out)`` normalises each contiguous group of
``group_size`` channels on its own (Mamba2's gated norm with ``n_groups`` groups); with a
gate ``z`` the input is ``x * silu(z)`` first (the prefill path; decode gates in the state
update already). ``out`` may be ``x`` itself (in place: each program reads its group before
it writes it), which saves the model a copy per Mamba layer.

Shapes: x, residual, z, out (tokens, hidden), weight (hidden,); any float dtype, math in
fp32. Inference mode: nothing but the outputs is allocated or written (no rstd).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.kernels._common import ACTIVATION_DTYPES, check_tensor, use_triton


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    n_cols,
    eps,
    x_row,
    res_row,
    out_row,
    res_out_row,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * x_row + cols, mask=ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_row + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * res_out_row + cols, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * out_row + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _group_rms_norm_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    out_ptr,
    group_size,
    eps,
    x_row,
    z_row,
    out_row,
    HAS_Z: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * group_size + tl.arange(0, BLOCK)
    ok = tl.arange(0, BLOCK) < group_size
    x = tl.load(x_ptr + row * x_row + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + row * z_row + cols, mask=ok, other=0.0).to(tl.float32)
        x = x * z * tl.sigmoid(z)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / group_size + eps)
    tl.store(out_ptr + row * out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch reference with the same signature and results (the CPU path)."""
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    xf = x.float()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return (out, x) if residual is not None else out


def group_rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    eps: float,
    z: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-PyTorch reference with the same signature and result (the CPU path)."""
    xf = x.float()
    if z is not None:
        xf = xf * torch.nn.functional.silu(z.float())
    g = xf.view(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    normed = (g.view(x.shape) * weight.float()).to(x.dtype)
    return normed if out is None else out.copy_(normed)


def _check_rows(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if like is None:
        check_tensor(name, t, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    else:
        check_tensor(name, t, tuple(like.shape), ACTIVATION_DTYPES, like.device, True)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Returns the normalised rows, and with ``residual`` also ``x + residual``."""
    _check_rows("x", x)
    check_tensor("weight", weight, (x.shape[1],), ACTIVATION_DTYPES, x.device)
    if residual is not None:
        _check_rows("residual", residual, x)
    if not use_triton(x):
        return rms_norm_ref(x, weight, eps, residual)
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    res = residual if residual is not None else x
    n_rows, n_cols = x.shape
    if n_rows:
        block = triton.next_power_of_2(n_cols)
        _rms_norm_kernel[(n_rows,)](
            x,
            res,
            weight,
            out,
            res_out,
            n_cols,
            eps,
            x.stride(0),
            res.stride(0),
            out.stride(0),
            res_out.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 512)),
        )
    return (out, res_out) if residual is not None else out


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
    _check_rows("x", x)
    hidden = x.shape[1]
    check_tensor("weight", weight, (hidden,), ACTIVATION_DTYPES, x.device)
    if group_size <= 0 or hidden % group_size:
        raise ValueError(f"group_size must divide the hidden size {hidden}, got {group_size}")
    if z is not None:
        _check_rows("z", z, x)
    if out is not None:
        _check_rows("out", out, x)
        if out.dtype != x.dtype:
            raise ValueError(f"out must have x's dtype {x.dtype}, got {out.dtype}")
    if not use_triton(x):
        return group_rms_norm_ref(x, weight, group_size, eps, z, out)
    return launch_group_rms_norm(x, weight, group_size, eps, z, out)


def launch_group_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    eps: float,
    z: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton launch of ``group_rms_norm`` without its argument checks, for a caller
    that has checked the same arguments already (``mamba2_decode``)."""
    hidden = x.shape[1]
    if out is None:
        out = torch.empty_like(x)
    if x.shape[0]:
        block = triton.next_power_of_2(group_size)
        zz = z if z is not None else x
        _group_rms_norm_kernel[(x.shape[0], hidden // group_size)](
            x,
            zz,
            weight,
            out,
            group_size,
            eps,
            x.stride(0),
            zz.stride(0),
            out.stride(0),
            HAS_Z=z is not None,
            BLOCK=block,
            num_warps=min(8, max(1, block // 256)),
        )
    return out
