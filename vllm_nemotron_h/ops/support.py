"""What the ops support, in one place, and the argument checks every op interface shares.

The ranges below are read by the ops' checks, by the model loader's validation
(model_executor/validation.py) and by the tests; nothing else writes them down.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

HEAD_DIM_RANGE = (32, 128)  # mamba_head_dim; 80 (not a power of two) included
D_STATE_RANGE = (16, 256)  # ssm_state_size
CONV_WIDTH_RANGE = (2, 4)  # conv_kernel
CONV_ACTIVATIONS = (None, "silu", "swish")  # swish is silu
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# States stored as int8 rows with an fp32 scale per row (ops/state_format.py); the ops that
# take them say so.
QUANTIZED_STATE_DTYPES = (torch.int8,)
ANY_STATE_DTYPES = STATE_DTYPES + QUANTIZED_STATE_DTYPES
# Tokens a deferred state's ring holds before it is written back (ops/deferred_state_update).
RING_SIZES = (2, 4, 8, 16, 32, 64)


def tensor_parallel_split_problem(heads: int, groups: int, tp: int) -> str | None:
    """Why the plugin's mixer cannot split ``heads`` Mamba heads and ``groups`` groups over
    ``tp`` ranks, or None: heads split evenly, groups too unless there is one (on every rank)."""
    if heads % tp:
        return f"mamba_num_heads={heads}, the plugin splits heads evenly over TP={tp}"
    if groups % tp and groups != 1:
        return f"n_groups={groups}, the plugin runs 1 or a multiple of TP={tp}"
    return None


def rank_heads_and_groups(heads: int, groups: int, tp: int) -> tuple[int, int]:
    """One rank's Mamba heads and groups (tensor_parallel_split_problem says where none)."""
    return heads // tp, max(groups // tp, 1)


def use_triton(tensor: torch.Tensor) -> bool:
    """Triton on CUDA tensors; on CPU tensors only under the Triton interpreter (tests)."""
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def check_tensor(
    name: str,
    tensor: torch.Tensor | None,
    shape: Sequence[int | None] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
    unit_last_stride: bool = False,
) -> None:
    """Raises ValueError naming ``name`` when the tensor does not fit; None entries in
    ``shape`` accept any size."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if shape is not None:
        ok = tensor.dim() == len(shape) and all(
            want is None or got == want for got, want in zip(tensor.shape, shape)
        )
        if not ok:
            want_str = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name} must have shape {want_str}, got {tuple(tensor.shape)}")
    if dtypes is not None and tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({allowed}), got {tensor.dtype}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} must be on {device}, got {tensor.device}")
    if unit_last_stride and tensor.dim() > 0 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension, got strides {tensor.stride()}"
        )


def check_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def check_slots(state_slots: torch.Tensor | None, batch: int, device: torch.device) -> None:
    if state_slots is not None:
        check_tensor("state_slots", state_slots, (batch,), (torch.int64,), device)
