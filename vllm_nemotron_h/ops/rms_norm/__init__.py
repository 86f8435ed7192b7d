"""Grouped RMSNorm (Mamba2's gated norm): kernel.py (Triton), interface.py (checks, dispatch),
reference.py (the literal oracle), cpu.py (the CPU serving path), args.py (the norm's
parameters)."""

from vllm_nemotron_h.ops.rms_norm.interface import group_rms_norm

__all__ = ["group_rms_norm"]
