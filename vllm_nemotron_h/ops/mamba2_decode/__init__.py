"""The fused Mamba2 decode tail (conv update, state update, gated group norm):
kernel.py (Triton), interface.py (checks, launch choice, dispatch), reference.py (the
literal oracle), cpu.py (the CPU serving path), args.py (the layer's and the step's
records), layout.py (the channel layout of a row)."""

from vllm_nemotron_h.ops.mamba2_decode.interface import mamba2_decode
from vllm_nemotron_h.ops.mamba2_decode.kernel import DecodeWorkspace

__all__ = ["DecodeWorkspace", "mamba2_decode"]
