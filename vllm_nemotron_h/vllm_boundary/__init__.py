"""Every vLLM internal the plugin touches, and nothing else of vLLM's: the one place a new
vLLM version can break the plugin. The rest of the package imports vLLM only through here
(``vllm.LLM``-level public API aside).

Each touchpoint is listed in TOUCHPOINTS: what it is, why the plugin needs it, the vLLM
versions it is tested on, and what would let it go. tests/test_vllm_boundary.py runs each
one's contract check against the installed vLLM and fails naming the touchpoint.
"""

from vllm_nemotron_h.vllm_boundary.touchpoints import TESTED_VLLM, TOUCHPOINTS, Touchpoint

__all__ = ["TESTED_VLLM", "TOUCHPOINTS", "Touchpoint"]
