"""Selective state update: kernel.py (Triton), interface.py (checks, config, dispatch),
reference.py (the literal oracle), cpu.py (the CPU serving path), args.py (its argument
record, which the deferred update takes too)."""

from vllm_nemotron_h.ops.selective_state_update.interface import selective_state_update

__all__ = ["selective_state_update"]
