"""The end of a Mamba2 prefill (the gated group norm of its rows, its final states into their
slots) in one launch: kernel.py (Triton), interface.py (checks, dispatch), reference.py (the
literal oracle), cpu.py (the CPU serving path)."""

from vllm_nemotron_h.ops.mamba2_prefill_tail.interface import mamba2_prefill_tail

__all__ = ["mamba2_prefill_tail"]
