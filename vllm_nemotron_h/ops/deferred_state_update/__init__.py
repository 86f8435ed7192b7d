"""The state update with deferred writes: kernel.py (Triton), interface.py (checks, config,
dispatch), reference.py (the literal oracle), cpu.py (the CPU serving path), layout.py (the
per-slot tensors: checkpoint and ring; a write-back's record) and the per-step update's
argument record (selective_state_update/args.py)."""

from vllm_nemotron_h.ops.deferred_state_update.interface import (
    deferred_state_update,
    flush_deferred_state,
)
from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState

__all__ = ["DeferredState", "deferred_state_update", "flush_deferred_state"]
