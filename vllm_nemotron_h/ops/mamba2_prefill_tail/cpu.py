"""The CPU serving path of the prefill tail: the group norm's CPU path, then PyTorch indexing
(quantizing first for an int8 state)."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.state_format import quantize


def write_final_states_cpu(states: FinalStates) -> None:
    """The states half of ``mamba2_prefill_tail_cpu``."""
    index = states.slots.long()
    if states.ssm_scale is None:
        states.ssm_state[index] = states.values
        return
    q, scale = quantize(states.values.float())
    states.ssm_state[index] = q
    states.ssm_scale[index] = scale


def mamba2_prefill_tail_cpu(
    y: torch.Tensor, gate: torch.Tensor, norm: GroupNorm, states: FinalStates
) -> None:
    """Same effects as the interface's ``mamba2_prefill_tail``; no checks."""
    group_rms_norm_cpu(y, norm, gate, y)
    write_final_states_cpu(states)
