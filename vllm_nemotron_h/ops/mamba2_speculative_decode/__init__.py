"""The Mamba2 decode tail under speculative decoding (several tokens per sequence, a state
kept per token): kernel.py (Triton), interface.py (checks, launch choice, dispatch),
reference.py (the literal oracle), cpu.py (the CPU serving path), args.py (the step's
record; the layer's is mamba2_decode's)."""

from vllm_nemotron_h.ops.mamba2_speculative_decode.interface import mamba2_speculative_decode

__all__ = ["mamba2_speculative_decode"]
