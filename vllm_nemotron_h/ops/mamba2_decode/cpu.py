"""The CPU serving path of the decode tail: the three ops' CPU paths in a row."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.cpu import causal_conv1d_update_cpu
from vllm_nemotron_h.ops.deferred_state_update.cpu import deferred_state_update_cpu
from vllm_nemotron_h.ops.mamba2_decode.args import (
    DecodeLayer,
    DecodeStep,
    conv_step,
    group_norm,
    state_update_step,
)
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.selective_state_update.cpu import selective_state_update_cpu


def mamba2_decode_cpu(layer: DecodeLayer, step: DecodeStep) -> torch.Tensor:
    """Same effects as the interface's ``mamba2_decode`` (``step.out`` given); no checks."""
    xbc, out = step.xbc, step.out
    conv = causal_conv1d_update_cpu(conv_step(layer, step, torch.empty_like(xbc)))
    ssu_step = state_update_step(layer, step, conv, out)
    if layer.deferred is not None:
        deferred_state_update_cpu(layer.deferred, ssu_step)
    else:
        selective_state_update_cpu(layer.ssm_state, layer.ssm_scale, ssu_step)
    if layer.norm_weight is not None:
        group_rms_norm_cpu(out, group_norm(layer, ssu_step.B.shape[1]), out=out)
    return out
