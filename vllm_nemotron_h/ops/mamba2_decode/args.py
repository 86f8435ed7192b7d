"""The decode tail's arguments as two records: the layer's (its states, weights and norm,
bound once) and the step's (this token's activations, slots and output). The public
function builds them; the decode plan keeps the layer's for every step; the launches, the
CPU path and the reference take both, and split them into the three ops' records here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep
from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState
from vllm_nemotron_h.ops.mamba2_decode.layout import split_xbc
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep


@dataclass(slots=True)
class DecodeLayer:
    """One Mamba layer's per-rank tensors; shapes and dtypes: interface.py's module doc.
    Without ``norm_weight`` the tail returns the gated y."""

    conv_state: torch.Tensor
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    ssm_state: torch.Tensor
    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor | None = None
    eps: float = 1e-5
    ssm_scale: torch.Tensor | None = None  # the per-row scales of an int8 ssm_state
    null_slot: int = -1
    # With deferred writes: ssm_state (and ssm_scale) as the checkpoint, with the rings; the
    # state update is then ops/deferred_state_update's, and the tail runs as three ops.
    deferred: DeferredState | None = None


@dataclass(slots=True)
class DecodeStep:
    """One decode step's rows: their activations (views of the input projection), their
    slots and the output; shapes and dtypes: interface.py's module doc."""

    xbc: torch.Tensor
    dt: torch.Tensor
    # None: y left ungated (the CPU paths, whose mixer gates in its norm as vLLM's does);
    # the Triton launches require it
    z: torch.Tensor | None
    state_slots: torch.Tensor | None = None
    out: torch.Tensor | None = None


def conv_step(layer: DecodeLayer, step: DecodeStep, out: torch.Tensor | None) -> ConvUpdateStep:
    """The tail's first op: the conv update of xbc (silu), into ``out``."""
    return ConvUpdateStep(
        step.xbc, layer.conv_state, layer.conv_weight, layer.conv_bias, "silu",
        step.state_slots, layer.null_slot, out,
    )  # fmt: skip


def state_update_step(
    layer: DecodeLayer, step: DecodeStep, conv: torch.Tensor, out: torch.Tensor | None
) -> StateUpdateStep:
    """The tail's second op: the state update of the conv output ``conv`` (split into x, B
    and C), gated by z where given, into ``out`` (batch, nheads * head_dim) when given."""
    _, nheads, head_dim, d_state = layer.ssm_state.shape
    x, B, C = split_xbc(conv, nheads, head_dim, d_state)
    z = step.z.reshape(x.shape) if step.z is not None else None
    y = out.view(x.shape) if out is not None else None
    return StateUpdateStep(
        x, step.dt, layer.A, B, C, layer.D, layer.dt_bias, z, step.state_slots, layer.null_slot, y
    )


def group_norm(layer: DecodeLayer, ngroups: int) -> GroupNorm:
    """The tail's third op: the group norm over heads per group x head_dim channels."""
    _, nheads, head_dim, _ = layer.ssm_state.shape
    return GroupNorm(layer.norm_weight, nheads * head_dim // ngroups, layer.eps)
