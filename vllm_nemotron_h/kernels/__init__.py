"""Decode kernels, each a Triton kernel beside its plain-PyTorch reference."""

from vllm_nemotron_h.kernels.causal_conv1d_update import (
    causal_conv1d_update,
    causal_conv1d_update_ref,
)
from vllm_nemotron_h.kernels.mamba2_decode import (
    DecodeWorkspace,
    mamba2_decode,
    mamba2_decode_ref,
)
from vllm_nemotron_h.kernels.rms_norm import (
    group_rms_norm,
    group_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from vllm_nemotron_h.kernels.selective_state_update import (
    selective_state_update,
    selective_state_update_ref,
)
from vllm_nemotron_h.kernels.state_slot_copy import (
    gather_state_slots,
    gather_state_slots_ref,
    scatter_state_slots,
    scatter_state_slots_ref,
)

__all__ = [
    "DecodeWorkspace",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
    "gather_state_slots",
    "gather_state_slots_ref",
    "group_rms_norm",
    "group_rms_norm_ref",
    "mamba2_decode",
    "mamba2_decode_ref",
    "rms_norm",
    "rms_norm_ref",
    "scatter_state_slots",
    "scatter_state_slots_ref",
    "selective_state_update",
    "selective_state_update_ref",
]
