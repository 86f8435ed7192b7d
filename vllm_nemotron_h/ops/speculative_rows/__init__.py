"""A speculative step's decode rows in the state cache manager's buffers (the slot table, token
starts and accepted counts, the counts counted where vLLM gives none): kernel.py (Triton),
interface.py (checks, dispatch), reference.py (the literal oracle), cpu.py (the CPU serving
path), args.py (the arguments)."""

from vllm_nemotron_h.ops.speculative_rows.interface import speculative_rows

__all__ = ["speculative_rows"]
