"""State slot copies (prefill's initial and final states): kernel.py (Triton), interface.py
(checks, dispatch), reference.py (the literal oracle), cpu.py (the CPU serving path)."""

from vllm_nemotron_h.ops.state_slot_copy.interface import gather_state_slots, scatter_state_slots

__all__ = ["gather_state_slots", "scatter_state_slots"]
