"""The prefill tail written literally: the group norm's reference, then one sequence at a
time into its slot, quantized by the int8 format's formula (the test oracle; production never
calls it)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.reference import group_rms_norm_reference
from vllm_nemotron_h.ops.state_format import quantize


def mamba2_prefill_tail_reference(
    y: torch.Tensor, gate: torch.Tensor, norm: GroupNorm, states: FinalStates
) -> None:
    """Same effects as ``mamba2_prefill_tail`` (see interface.py)."""
    group_rms_norm_reference(y, norm, gate, y)
    for row in range(states.slots.shape[0]):
        slot, values = int(states.slots[row]), states.values[row]
        if states.ssm_scale is None:
            states.ssm_state[slot] = values
        else:
            states.ssm_state[slot], states.ssm_scale[slot] = quantize(values.float())
