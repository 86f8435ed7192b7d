"""The CPU serving path of the decode tail: the three ops' CPU paths in a row."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.cpu import causal_conv1d_update_cpu
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.selective_state_update.cpu import selective_state_update_cpu


def mamba2_decode_cpu(
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
    norm_weight: torch.Tensor | None,
    eps: float,
    state_slots: torch.Tensor | None,
    null_slot: int,
    out: torch.Tensor,
    ssm_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same arguments and effects as the interface's ``mamba2_decode`` (no workspace, ``out``
    given); no checks."""
    batch = xbc.shape[0]
    _, nheads, head_dim, d_state = ssm_state.shape
    conv = causal_conv1d_update_cpu(
        xbc, conv_state, conv_weight, conv_bias, "silu", state_slots, null_slot,
        torch.empty(xbc.shape, dtype=xbc.dtype),
    )  # fmt: skip
    x, B, C = split_xbc(conv, nheads, head_dim, d_state)
    selective_state_update_cpu(
        ssm_state, x, dt, A, B, C, D, dt_bias, z.reshape(batch, nheads, head_dim),
        state_slots, null_slot, out.view(batch, nheads, head_dim), ssm_scale,
    )  # fmt: skip
    if norm_weight is not None:
        group_rms_norm_cpu(out, norm_weight, nheads * head_dim // B.shape[1], eps, out=out)
    return out
