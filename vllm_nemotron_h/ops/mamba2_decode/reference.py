"""The decode tail as the three ops' literal references in a row, with the roundings the
production paths make (the conv output and y in the activation dtype): the test oracle of
both the fused kernel and the three-kernel path; production never calls it."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.reference import causal_conv1d_update_reference
from vllm_nemotron_h.ops.mamba2_decode.args import (
    DecodeLayer,
    DecodeStep,
    conv_step,
    group_norm,
    state_update_step,
)
from vllm_nemotron_h.ops.rms_norm.reference import group_rms_norm_reference
from vllm_nemotron_h.ops.selective_state_update.reference import (
    selective_state_update_reference,
)


def mamba2_decode_reference(layer: DecodeLayer, step: DecodeStep) -> torch.Tensor:
    """Same effects as ``mamba2_decode`` (see interface.py); returns the output
    (``step.out`` when given)."""
    # The conv output and y rounded to the activation dtype, as those ops store them.
    conv = causal_conv1d_update_reference(conv_step(layer, step, None))
    ssu_step = state_update_step(layer, step, conv, None)
    y = selective_state_update_reference(layer.ssm_state, ssu_step, layer.ssm_scale)
    y = y.flatten(1)
    if layer.norm_weight is not None:
        y = group_rms_norm_reference(y, group_norm(layer, ssu_step.B.shape[1]))
    return y if step.out is None else step.out.copy_(y)
