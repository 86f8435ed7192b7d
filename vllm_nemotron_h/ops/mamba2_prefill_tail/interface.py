"""The end of a Mamba2 prefill in one launch, after vLLM's chunked scan: the prefill rows'
gated group RMSNorm, in place, and the sequences' final SSM states written into their slots.

``mamba2_prefill_tail(y, gate, weight, group_size, eps, ssm_state, slots, final_states,
ssm_scale=None)``:

    y <- group_rms_norm(y, weight, group_size, eps, z=gate)    (ops/rms_norm)
    ssm_state[slots[i]] <- final_states[i]                      (ops/state_slot_copy's scatter)
    an int8 state: ssm_state[slots[i]], ssm_scale[slots[i]] <- quantize(final_states[i])
                                                                (ops/state_format.py)

Shapes: y, gate (tokens, hidden), each contiguous in its last dimension; weight (hidden,);
ssm_state (num_slots, nheads, head_dim, d_state) with each slot contiguous (vLLM's views may
pad the slot stride); ssm_scale (num_slots, nheads, head_dim) fp32 for an int8 state, else
None; slots (rows,) int32 or int64, distinct, any stride (a column of vLLM's block table);
final_states (rows, nheads, head_dim, d_state) with each row contiguous, in the state's
dtype (fp32 for an int8 state: the scan's).
Why one launch: in a prefill step without a CUDA graph (a prompt longer than the largest
captured size, and always for the mixer, a graph split point) each Triton launch costs tens
of microseconds of host time per Mamba layer, and vLLM's model normalises in code that
torch.compile fuses; the norm and the state write are independent, so one grid runs both.
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.mamba2_prefill_tail import kernel
from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.mamba2_prefill_tail.cpu import mamba2_prefill_tail_cpu
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.interface import check_group
from vllm_nemotron_h.ops.state_slot_copy.interface import check_state
from vllm_nemotron_h.ops.support import (
    ACTIVATION_DTYPES,
    ANY_STATE_DTYPES,
    check_tensor,
    use_triton,
)


def check_final_states(states: FinalStates) -> None:
    """Raises ValueError naming the first state argument that does not fit."""
    ssm_state, ssm_scale, slots, values = (
        states.ssm_state, states.ssm_scale, states.slots, states.values
    )  # fmt: skip
    check_state(ssm_state, slots)
    check_tensor("ssm_state", ssm_state, (None, None, None, None), ANY_STATE_DTYPES)
    quantized = ssm_state.dtype == torch.int8
    if quantized:
        check_tensor(
            "ssm_scale", ssm_scale, ssm_state.shape[:3], (torch.float32,), ssm_state.device
        )
        check_state(ssm_scale, slots)
    elif ssm_scale is not None:
        raise ValueError(f"ssm_scale is for an int8 ssm_state only, got a {ssm_state.dtype} state")
    want = torch.float32 if quantized else ssm_state.dtype
    check_tensor(
        "final_states", values, (slots.shape[0], *ssm_state.shape[1:]), (want,), ssm_state.device
    )
    if values.shape[0] and not values[0].is_contiguous():
        raise ValueError(
            f"final_states must have each row contiguous, got strides {values.stride()}"
        )


def check(y: torch.Tensor, gate: torch.Tensor, norm: GroupNorm, states: FinalStates) -> None:
    """Raises ValueError naming the first argument of ``mamba2_prefill_tail`` that does not fit."""
    check_tensor("y", y, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    check_tensor("gate", gate, tuple(y.shape), ACTIVATION_DTYPES, y.device, True)
    check_group(y, norm, gate, y)
    check_final_states(states)
    if states.ssm_state.device != y.device:
        raise ValueError(
            f"ssm_state must be on y's device {y.device}, got {states.ssm_state.device}"
        )


def mamba2_prefill_tail(
    y: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    eps: float,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    final_states: torch.Tensor,
    ssm_scale: torch.Tensor | None = None,
) -> None:
    """Normalises ``y`` in place (gated by silu(``gate``)) and writes ``final_states[i]`` into
    slot ``slots[i]`` of ``ssm_state`` (with its scales for an int8 state)."""
    norm = GroupNorm(weight, group_size, eps)
    states = FinalStates(ssm_state, ssm_scale, slots, final_states)
    check(y, gate, norm, states)
    if not use_triton(y):
        mamba2_prefill_tail_cpu(y, gate, norm, states)
        return
    kernel.launch(y, gate, norm, states)
