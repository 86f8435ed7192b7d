"""Shared helpers of the kernel tests: devices, seeded inputs, poisoning, relative error."""

from __future__ import annotations

import pytest
import torch

from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.state_format import dequantize
from vllm_nemotron_h.testing.op_inputs import Draw, record_of

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
# An int8 state adds no rounding to y (y is reduced from the fp32 state before it is stored);
# its stored values are compared within one quantum (assert_int8_state_close).
TOL[torch.int8] = TOL[torch.float32]
# The Triton interpreter rounds fp32 -> bf16 by truncation, not to nearest even as the GPU and
# torch do (half of 4,096 random values came out one bf16 step apart, up to 0.8 %). A kernel
# that rounds intermediates to bf16 (the fused decode tail rounds the conv output) then drifts
# from the reference by up to ~2.5 % in the interpreter (seen over 60 random cases).
INTERPRETER_BF16_TOL = 5e-2


def tolerance(act: torch.dtype, state_dtype: torch.dtype, device: str) -> float:
    """What a kernel with bf16-rounded intermediates may differ from its reference by."""
    if act == torch.bfloat16 and device == "cpu":
        return INTERPRETER_BF16_TOL
    return max(TOL[act], TOL[state_dtype])


def draw(device: str) -> Draw:
    """Inputs on ``device`` from a generator seeded from torch's global generator, which the
    autouse fixture in conftest.py seeds per test (printed, replayable)."""
    return Draw.seeded(int(torch.randint(2**31, (1,))), device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output (unwritten or poisoned element)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """A tensor like ``t`` full of NaN: any element the kernel does not write stays NaN."""
    return torch.full_like(t, float("nan"))


def assert_int8_state_close(q, scale, ref_q, ref_scale, quanta: int = 1) -> None:
    """int8 states (with their scales) whose values lie within ``quanta`` quanta of the
    reference's rows, where the reference's row is finite: a value on a rounding boundary may
    round either way between the kernel's fp32 and the reference's fp64, once per rounding
    that a stored value went through from a common start."""
    got = dequantize(q, scale).double()
    want = dequantize(ref_q.to(q.device), ref_scale.to(q.device)).double()
    quantum = ref_scale.to(q.device).double()[..., None].expand_as(want)
    ok = torch.isfinite(want).all(-1, keepdim=True).expand_as(want)
    assert ((got - want).abs()[ok] <= 1.001 * quanta * quantum[ok] + 1e-30).all()


def step_of(t: dict, **overrides: object) -> StateUpdateStep:
    """The state update's step record of the inputs ``t``, with vLLM's null slot."""
    return record_of(StateUpdateStep, t, null_slot=0, **overrides)


def decode_records(t: dict, **overrides: object) -> tuple[DecodeLayer, DecodeStep]:
    """The decode tail's records of the inputs ``t``, with vLLM's null slot."""
    both = {"null_slot": 0, **overrides}
    return record_of(DecodeLayer, t, **both), record_of(DecodeStep, t, **both)
