"""The Triton kernel of the grouped RMSNorm and its launch (no checks): see interface.py for
the math. Inference only: nothing but the outputs is written (no rstd)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.ops.rms_norm.args import GroupNorm


@triton.jit
def group_norm_program(
    x_ptr, z_ptr, w_ptr, out_ptr, row, group, group_size, eps, x_row, z_row, out_row,
    HAS_Z: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Normalises group ``group`` of row ``row`` (one program's work; the prefill tail's
    norm programs run it too)."""
    row = row.to(tl.int64)
    cols = group * group_size + tl.arange(0, BLOCK)
    ok = tl.arange(0, BLOCK) < group_size
    x = tl.load(x_ptr + row * x_row + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + row * z_row + cols, mask=ok, other=0.0).to(tl.float32)
        x = x * z * tl.sigmoid(z)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / group_size + eps)
    tl.store(out_ptr + row * out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _group_rms_norm_kernel(
    x_ptr, z_ptr, w_ptr, out_ptr, group_size, eps, x_row, z_row, out_row,
    HAS_Z: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    group_norm_program(
        x_ptr, z_ptr, w_ptr, out_ptr, tl.program_id(0), tl.program_id(1), group_size, eps,
        x_row, z_row, out_row, HAS_Z, BLOCK,
    )  # fmt: skip


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
