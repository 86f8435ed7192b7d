"""The decode tail as the three ops' literal references in a row, with the roundings the
production paths make (the conv output and y in the activation dtype): the test oracle of
both the fused kernel and the three-kernel path; production never calls it."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.reference import causal_conv1d_update_reference
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.rms_norm.reference import group_rms_norm_reference
from vllm_nemotron_h.ops.selective_state_update.reference import (
    selective_state_update_reference,
)


def mamba2_decode_reference(
    xbc: torch.Tensor,
    dt: torch.Tensor,
    z: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    ssm_state: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    workspace: object = None,
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    ssm_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and effects as ``mamba2_decode`` (see interface.py); ``workspace`` is
    not used."""
    batch = xbc.shape[0]
    _, nheads, head_dim, d_state = ssm_state.shape
    conv = causal_conv1d_update_reference(
        xbc, conv_state, conv_weight, conv_bias, "silu", state_slots, null_slot
    )  # rounded to the activation dtype, as the conv op stores it
    x, B, C = split_xbc(conv, nheads, head_dim, d_state)
    y = selective_state_update_reference(
        ssm_state,
        x,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        z.reshape(batch, nheads, head_dim),
        state_slots,
        null_slot,
        state_scale=ssm_scale,
    ).reshape(batch, nheads * head_dim)  # rounded to the activation dtype, as y is stored
    if norm_weight is not None:
        y = group_rms_norm_reference(y, norm_weight, nheads * head_dim // B.shape[1], eps)
    return y if out is None else out.copy_(y)
