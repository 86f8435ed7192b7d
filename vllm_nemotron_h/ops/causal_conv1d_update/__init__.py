"""Causal conv1d update: kernel.py (Triton), interface.py (checks, config, dispatch),
reference.py (the literal oracle), cpu.py (the CPU serving path), args.py (its argument
record)."""

from vllm_nemotron_h.ops.causal_conv1d_update.interface import causal_conv1d_update

__all__ = ["causal_conv1d_update"]
