"""What an SSM state format adds to a Mamba layer's state in vLLM's cache.

vLLM keeps a Mamba2 layer's state as tensors of one page per slot (the model's and the
layer's state shape / dtype methods): (conv state, SSM state). An int8 state (validation.py's
``ssm_state`` option) adds a third tensor, the SSM state's fp32 scales per (head, head_dim
row), so slot allocation, preemption, prefix-caching copies and tensor-parallel sharding
carry the scales as they carry the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

INT8 = "int8"


def state_shapes(
    vllm_shapes: tuple[tuple[int, ...], ...], ssm_format: str
) -> tuple[tuple[int, ...], ...]:
    """(conv, ssm[, ssm scales]) per-slot shapes from vLLM's (conv, ssm)."""
    conv, ssm = vllm_shapes
    return (conv, ssm, ssm[:-1]) if ssm_format == INT8 else (conv, ssm)


def state_dtypes(vllm_dtypes: tuple[torch.dtype, ...], ssm_format: str) -> tuple[torch.dtype, ...]:
    """(conv, ssm[, ssm scales]) dtypes from vLLM's (conv, ssm)."""
    conv, ssm = vllm_dtypes
    return (conv, torch.int8, torch.float32) if ssm_format == INT8 else (conv, ssm)


def state_copy_funcs(
    vllm_funcs: tuple[Callable[..., Any], ...], ssm_format: str
) -> tuple[Callable[..., Any], ...]:
    """Prefix caching's per-tensor copy functions from vLLM's (conv, ssm): the scales are
    copied as the SSM state is (a whole slot)."""
    conv, ssm = vllm_funcs
    return (conv, ssm, ssm) if ssm_format == INT8 else (conv, ssm)


def scan_state_dtype(ssm_dtype: torch.dtype) -> torch.dtype:
    """The dtype vLLM's chunked scan carries a layer's SSM states in: fp32 for an int8 state
    (gathered dequantized, scattered quantized), the state's own dtype otherwise."""
    return torch.float32 if ssm_dtype == torch.int8 else ssm_dtype
