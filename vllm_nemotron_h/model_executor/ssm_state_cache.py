"""What the plugin's options add to a Mamba layer's state in vLLM's cache.

vLLM keeps a Mamba2 layer's state as tensors of one page per slot (the model's and the
layer's state shape / dtype methods): (conv state, SSM state). The plugin appends, in this
order, so that slot allocation, preemption, prefix-caching copies and tensor-parallel
sharding carry them as they carry the state itself:

- an int8 state (validation.py's ``ssm_state`` option): the SSM state's fp32 scales per
  (head, head_dim row);
- deferred state writes (``deferred_state_writes``: L): the ring of the tokens since the SSM
  state (then a checkpoint) was last written, per ops/deferred_state_update/layout.py:
  x, dt, B of up to L tokens and the ring's length per head. x and B keep the conv state's
  dtype (the activations', unless ``mamba_ssm_cache_dtype`` says otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState, ring_dtypes, ring_shapes
from vllm_nemotron_h.ops.mamba2_decode.layout import ngroups_of

INT8 = "int8"


@dataclass(frozen=True)
class StateLayout:
    """The state format and the ring size (0: the state is written at every token)."""

    ssm_format: str
    ring_size: int = 0

    @property
    def adds_tensors(self) -> bool:
        """Whether the layout appends tensors to vLLM's; if not, vLLM's state (whatever its
        model declares, e.g. ReplaySSM's rings for a config handed back to it) is used as is."""
        return self.ssm_format == INT8 or self.ring_size > 0

    def shapes(
        self, vllm_shapes: tuple[tuple[int, ...], ...], conv_dim: int
    ) -> tuple[tuple[int, ...], ...]:
        """Per-slot shapes from vLLM's (conv, ssm); ``conv_dim`` the conv state's channels."""
        if not self.adds_tensors:
            return tuple(vllm_shapes)
        conv, ssm = vllm_shapes
        shapes = [conv, ssm]
        if self.ssm_format == INT8:
            shapes.append(ssm[:-1])
        if self.ring_size:
            nheads, head_dim, d_state = ssm
            ngroups = ngroups_of(conv_dim, nheads, head_dim, d_state)
            shapes.extend(ring_shapes(nheads, head_dim, d_state, ngroups, self.ring_size))
        return tuple(shapes)

    def dtypes(self, vllm_dtypes: tuple[torch.dtype, ...]) -> tuple[torch.dtype, ...]:
        """Per-slot dtypes from vLLM's (conv, ssm)."""
        if not self.adds_tensors:
            return tuple(vllm_dtypes)
        conv, ssm = vllm_dtypes
        dtypes = [conv, torch.int8, torch.float32] if self.ssm_format == INT8 else [conv, ssm]
        if self.ring_size:
            dtypes.extend(ring_dtypes(conv))
        return tuple(dtypes)

    def copy_funcs(self, vllm_funcs: tuple[Callable[..., Any], ...]) -> tuple[Callable, ...]:
        """Prefix caching's per-tensor copy functions from vLLM's (conv, ssm): what the
        plugin appends is copied as the SSM state is (a whole slot)."""
        if not self.adds_tensors:
            return tuple(vllm_funcs)
        conv, ssm = vllm_funcs
        extra = (self.ssm_format == INT8) + (4 if self.ring_size else 0)
        return (conv, ssm) + (ssm,) * extra

    def split(
        self, states: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor | None, DeferredState | None]:
        """(SSM state, its scales or None, the deferred state or None) from the bound
        tensors after the conv state."""
        ssm, rest = states[0], list(states[1:])
        scale = rest.pop(0) if self.ssm_format == INT8 else None
        deferred = DeferredState(ssm, scale, *rest) if self.ring_size else None
        return ssm, scale, deferred


def scan_state_dtype(ssm_dtype: torch.dtype) -> torch.dtype:
    """The dtype vLLM's chunked scan carries a layer's SSM states in: fp32 for an int8 state
    (gathered dequantized, scattered quantized), the state's own dtype otherwise."""
    return torch.float32 if ssm_dtype == torch.int8 else ssm_dtype
