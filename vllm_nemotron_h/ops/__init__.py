"""The ops the plugin owns, one folder each: kernel.py (the Triton kernel and its unchecked
launch), interface.py (argument checks, launch config, dispatch: the public function),
reference.py (a slow, literal oracle for the tests; production never calls it), cpu.py
(the CPU serving path) and args.py (the op's arguments as one record: the public function
builds it, the other three take it). support.py holds the supported ranges,
launch_config.py the per-device launch tables (configs/), triton_helpers.py the device
functions kernels share."""

from vllm_nemotron_h.ops.causal_conv1d_update import causal_conv1d_update
from vllm_nemotron_h.ops.deferred_state_update import (
    DeferredState,
    deferred_state_update,
    flush_deferred_state,
)
from vllm_nemotron_h.ops.mamba2_decode import DecodeWorkspace, mamba2_decode
from vllm_nemotron_h.ops.mamba2_prefill_tail import mamba2_prefill_tail
from vllm_nemotron_h.ops.mamba2_speculative_decode import mamba2_speculative_decode
from vllm_nemotron_h.ops.rms_norm import group_rms_norm
from vllm_nemotron_h.ops.selective_state_update import selective_state_update
from vllm_nemotron_h.ops.state_slot_copy import gather_state_slots, scatter_state_slots

__all__ = [
    "DecodeWorkspace",
    "DeferredState",
    "causal_conv1d_update",
    "deferred_state_update",
    "flush_deferred_state",
    "gather_state_slots",
    "group_rms_norm",
    "mamba2_decode",
    "mamba2_prefill_tail",
    "mamba2_speculative_decode",
    "scatter_state_slots",
    "selective_state_update",
]
