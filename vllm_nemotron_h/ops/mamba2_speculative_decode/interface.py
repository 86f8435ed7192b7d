"""The decode tail of a Mamba2 layer under speculative decoding: each sequence verifies its
last sampled token and its draft tokens in one step, and the state after every one of those
tokens is kept, so that the next step starts from the state after the last token the
sampler accepted (vLLM's layout of Mamba states under speculative decoding: a slot per
token, ``num_accepted_tokens``).

Sequence ``r`` owns the tokens ``query_start[r] .. query_start[r + 1] - 1`` (q <= K of them,
K = ``state_slots.shape[1]``) and the K slots ``state_slots[r]``. With ``a = num_accepted[r]``
(1..K, the tokens the sampler accepted at the sequence's previous step)::

    conv:  the conv state of slot state_slots[r, 0] has width - 1 + K - 1 columns; the
           tokens' history is columns a - 1 .. a + width - 3 (the accepted window); after
           the step, columns 0 .. width - 3 + q hold that window but its first column, then
           the q tokens' xbc: the next step's accepted count selects its window again.
    ssm:   the state is read from slot state_slots[r, a - 1]; after token t it is written,
           in the state's format, to slot state_slots[r, t] (not at all where that slot is
           the null slot), and token t + 1 goes on from the value stored: a 16-bit or int8
           state rounds exactly as decoding one token per step does.
    each token then as in mamba2_decode: split, state update with D and the silu(z) gate,
    the group norm (when ``norm_weight`` is given).

With q = 1 and a = 1 a row has the effects of one mamba2_decode step (conv state columns
0 .. width - 2 as that op's state). A row whose first slot is the null slot (vLLM's padding)
reads and writes no state; its tokens' outputs are zero.

Shapes and dtypes (T tokens in all):
    xbc (T, conv_dim), dt (T, nheads), z and out (T, nheads * head_dim): as mamba2_decode's
    conv_state   (num_slots, conv_dim, width - 1 + K - 1)   any strides
    ssm_state, ssm_scale, conv and SSM weights, norm_weight: as mamba2_decode's (no
    deferred writes)
    state_slots  (rows, K) int64
    query_start  (rows + 1,) int64, nondecreasing, at most T
    num_accepted (rows,) int64, each 1..K
"""

from __future__ import annotations

from dataclasses import replace

import torch

from vllm_nemotron_h.ops.mamba2_decode import interface as decode_op
from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.mamba2_decode.interface import DecodeShape
from vllm_nemotron_h.ops.mamba2_speculative_decode import kernel
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu import mamba2_speculative_decode_cpu
from vllm_nemotron_h.ops.support import check_tensor, use_triton


def check(layer: DecodeLayer, step: SpeculativeStep) -> None:
    """Raises ValueError naming the first argument that does not fit (shapes, dtypes,
    devices; the values of the slots, starts and counts are check_values')."""
    if layer.deferred is not None:
        raise ValueError("deferred must be None: speculative decoding writes a state per token")
    check_tensor("state_slots", step.state_slots, (None, None), (torch.int64,), step.xbc.device)
    rows, max_tokens = step.state_slots.shape
    width = layer.conv_weight.shape[1] if layer.conv_weight.dim() == 2 else 0
    conv_columns = width - 1 + max_tokens - 1
    if layer.conv_state.dim() != 3 or layer.conv_state.shape[2] != conv_columns:
        raise ValueError(
            f"conv_state must have conv width - 1 + state_slots.shape[1] - 1 = {conv_columns} "
            f"columns, got shape {tuple(layer.conv_state.shape)}"
        )
    # The rest as one decode step of every token (the conv state's first width - 1 columns).
    one_token = replace(layer, conv_state=layer.conv_state[..., : width - 1])
    decode_op.check(one_token, DecodeStep(step.xbc, step.dt, step.z, None, step.out))
    dev = step.xbc.device
    check_tensor("query_start", step.query_start, (rows + 1,), (torch.int64,), dev)
    check_tensor("num_accepted", step.num_accepted, (rows,), (torch.int64,), dev)


def check_values(layer: DecodeLayer, step: SpeculativeStep) -> None:
    """Raises ValueError when the starts, counts or slots are out of range (reads them: a
    device sync; the public function checks, the decode plan trusts vLLM's metadata)."""
    starts, accepted = step.query_start.cpu(), step.num_accepted.cpu()
    lens = starts.diff()
    slots = step.state_slots.cpu()
    if len(starts) and (starts[0] < 0 or starts[-1] > step.xbc.shape[0]):
        raise ValueError(f"query_start must lie in 0..{step.xbc.shape[0]}, got {starts.tolist()}")
    if bool((lens < 0).any()) or bool((lens > step.max_tokens).any()):
        raise ValueError(
            f"query_start must be nondecreasing with at most {step.max_tokens} tokens per "
            f"row, got {starts.tolist()}"
        )
    if bool(((accepted < 1) | (accepted > step.max_tokens)).any()):
        raise ValueError(f"num_accepted must lie in 1..{step.max_tokens}, got {accepted.tolist()}")
    num_slots = layer.ssm_state.shape[0]
    in_range = (slots == layer.null_slot) | ((slots >= 0) & (slots < num_slots))
    if not bool(in_range.all()):
        raise ValueError(
            f"state_slots must be {layer.null_slot} (the null slot) or lie in 0..{num_slots - 1}"
        )


def launch_configs(layer: DecodeLayer, step: SpeculativeStep) -> tuple[tuple[int, int], ...]:
    """(conv (BLOCK_D, num_warps), state update (BLOCK_M, num_warps)): the device table's
    choices for one decode step of as many sequences."""
    one_token = replace(layer, conv_state=layer.conv_state[..., : layer.conv_weight.shape[1] - 1])
    launch = decode_op.resolve_launch(DecodeShape.of(step.xbc, one_token), step.rows)
    return launch.conv_config, launch.ssu_config


def run(layer: DecodeLayer, step: SpeculativeStep, configs: tuple[tuple[int, int], ...]):
    """The GPU (or Triton interpreter) launches with ``launch_configs``' result, or the CPU
    path; ``step.out`` given, no checks."""
    if not use_triton(step.xbc):
        return mamba2_speculative_decode_cpu(layer, step)
    return kernel.launch(layer, step, *configs)


def mamba2_speculative_decode(
    xbc: torch.Tensor,
    dt: torch.Tensor,
    z: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    ssm_state: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state_slots: torch.Tensor,
    query_start: torch.Tensor,
    num_accepted: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    ssm_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advances the states of every sequence over its tokens in place (see the module doc)
    and returns ``out`` (T, nheads * head_dim): normalised when ``norm_weight`` is given,
    else gated y. ``ssm_scale`` holds the per-row scales of an int8 ``ssm_state``."""
    layer = DecodeLayer(
        conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias, norm_weight, eps,
        ssm_scale, null_slot,
    )  # fmt: skip
    step = SpeculativeStep(xbc, dt, z, state_slots, query_start, num_accepted, out)
    check(layer, step)
    check_values(layer, step)
    if out is None:
        step.out = torch.empty_like(z)
    return run(layer, step, launch_configs(layer, step) if use_triton(xbc) else ())
