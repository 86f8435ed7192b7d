"""The Triton kernels of RMSNorm and grouped RMSNorm and their launches (no checks): see
interface.py for the math. Inference only: nothing but the outputs is written (no rstd)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.rms_norm.args import GroupNorm


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
    x_row, res_row, out_row, res_out_row,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
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
    x_ptr, z_ptr, w_ptr, out_ptr, group_size, eps, x_row, z_row, out_row,
    HAS_Z: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
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


def launch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Launches the row kernel; no argument checks (the interface checks)."""
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    res = residual if residual is not None else x
    n_rows, n_cols = x.shape
    if n_rows:
        block = triton.next_power_of_2(n_cols)
        _rms_norm_kernel[(n_rows,)](
            x, res, weight, out, res_out, n_cols, eps,
            x.stride(0), res.stride(0), out.stride(0), res_out.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=min(16, max(1, block // 512)),
        )  # fmt: skip
    return (out, res_out) if residual is not None else out


def launch_group(
    x: torch.Tensor, norm: GroupNorm, z: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Launches the group kernel; no argument checks (the interface and the decode plan
    check)."""
    hidden = x.shape[1]
    if out is None:
        out = torch.empty_like(x)
    if x.shape[0]:
        block = triton.next_power_of_2(norm.group_size)
        zz = z if z is not None else x
        _group_rms_norm_kernel[(x.shape[0], hidden // norm.group_size)](
            x, zz, norm.weight, out, norm.group_size, norm.eps,
            x.stride(0), zz.stride(0), out.stride(0),
            HAS_Z=z is not None, BLOCK=block, num_warps=min(8, max(1, block // 256)),
        )  # fmt: skip
    return out
