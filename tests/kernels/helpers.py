"""Shared helpers of the kernel tests: devices, poisoning, relative error."""

from __future__ import annotations

import pytest
import torch

GPU = torch.cuda.is_available()
DEVICES = [
    pytest.param("cpu", id="cpu-interpreter", marks=pytest.mark.skipif(GPU, reason="GPU present")),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")],
    ),
]
# ||out - ref|| / ||ref|| allowed per output dtype (fp32 math everywhere).
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output (unwritten or poisoned element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """A tensor like ``t`` full of NaN: any element the kernel does not write stays NaN."""
    return torch.full_like(t, float("nan"))
