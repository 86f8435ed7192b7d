"""Causal depthwise conv1d for one decode token, with the rolling conv state update.

For every sequence ``b`` and channel ``c`` with window ``w = [state[slot_b, c, :], x[b, c]]``::

    out[b, c] = act(sum_k weight[c, k] * w[k] + bias[c])
    state[slot_b, c, :] = w[1:]

Rows whose slot equals ``null_slot`` neither read nor write the state; their output is zero.

Shapes and dtypes:
    x, out      (batch, dim)                    activation dtype; out may be x (in place)
    conv_state  (num_slots, dim, width - 1)     any strides (vLLM's DS or SD layout)
    weight      (dim, width), bias (dim,)       width: ops/support.py
    state_slots (batch,)                        int64
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops import launch_config as configs
from vllm_nemotron_h.ops.causal_conv1d_update import kernel
from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep
from vllm_nemotron_h.ops.causal_conv1d_update.cpu import causal_conv1d_update_cpu
from vllm_nemotron_h.ops.support import (
    ACTIVATION_DTYPES,
    CONV_ACTIVATIONS,
    CONV_WIDTH_RANGE,
    STATE_DTYPES,
    check_range,
    check_slots,
    check_tensor,
    use_triton,
)

DEFAULT_CONFIG = (256, 4)


@configs.cached
def launch_config(device: torch.device, batch_dim: int) -> tuple[int, int]:
    """(BLOCK_D, num_warps) of one launch over ``batch_dim`` = batch x channels."""
    rows = configs.table("causal_conv1d_update", device)
    return configs.first_fit(rows, batch_dim) or DEFAULT_CONFIG


def check(step: ConvUpdateStep) -> None:
    """Raises ValueError naming the first argument that does not fit."""
    x = step.x
    check_tensor("x", x, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    batch, dim = x.shape
    dev = x.device
    check_tensor("weight", step.weight, (dim, None), ACTIVATION_DTYPES, dev)
    width = step.weight.shape[1]
    check_range("weight.shape[1] (conv width)", width, CONV_WIDTH_RANGE)
    check_tensor("conv_state", step.conv_state, (None, dim, width - 1), STATE_DTYPES, dev)
    if step.bias is not None:
        check_tensor("bias", step.bias, (dim,), ACTIVATION_DTYPES, dev)
    if step.activation not in CONV_ACTIVATIONS:
        raise ValueError(f"activation must be one of {CONV_ACTIVATIONS}, got {step.activation!r}")
    check_slots(step.state_slots, batch, dev)
    if step.out is not None:
        check_tensor("out", step.out, (batch, dim), ACTIVATION_DTYPES, dev, unit_last_stride=True)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Convolves one new token per sequence and rolls ``conv_state`` in place.
    ``config`` = (BLOCK_D, num_warps) overrides the device's launch table."""
    step = ConvUpdateStep(x, conv_state, weight, bias, activation, state_slots, null_slot, out)
    check(step)
    if out is None:
        step.out = torch.empty_like(x)
    if not use_triton(x):
        return causal_conv1d_update_cpu(step)
    block_d, num_warps = config or launch_config(x.device, x.shape[0] * x.shape[1])
    return kernel.launch(step, block_d, num_warps)
