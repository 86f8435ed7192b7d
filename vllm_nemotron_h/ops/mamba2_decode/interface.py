"""The decode tail of a Mamba2 layer: conv update -> state update -> gated group norm.

For every sequence ``b`` (``slot_b = state_slots[b]``)::

    xbc' = silu(causal_conv1d_update(xbc[b], conv_state[slot_b]))     (rolls conv_state)
    x, B, C = split(xbc', [nheads * head_dim, ngroups * d_state, ngroups * d_state])
    y    = selective_state_update(ssm_state[slot_b], x, dt, A, B, C, D, dt_bias, z)
    out  = group_rms_norm(y, norm_weight, heads per group x head_dim, eps)   (when given)

with the roundings of the three ops run one after the other: the conv output and y are
rounded to the activation dtype where those ops store them. Without ``norm_weight`` the
output is the gated y (the norm then runs apart, e.g. when its group spans tensor-parallel
ranks). On the GPU it runs as one fused launch (kernel.py) up to a batch x heads size from
the device's table, and as the three ops' kernels above it, where the fused launch's
per-program arrival and the group's B and C windows every program convolves cost more.

Shapes and dtypes:
    xbc         (batch, nheads * head_dim + 2 * ngroups * d_state)   activation dtype, rows
                may be strided (a view of the input projection)
    dt          (batch, nheads); z, out (batch, nheads * head_dim)    activation dtype
    conv_state  (num_slots, conv_dim, width - 1)                      any strides
    conv_weight (conv_dim, width), conv_bias (conv_dim,)
    ssm_state   (num_slots, nheads, head_dim, d_state)                state dtype, or int8
    ssm_scale   (num_slots, nheads, head_dim) fp32                    with its per-row scales
                                                                      (ops/state_format.py)
    deferred    the rings of deferred writes with ssm_state (and ssm_scale) as their
                checkpoint (ops/deferred_state_update/layout.py), or None; with them the
                state update is the deferred one and the tail runs as the three ops
    A, D, dt_bias (nheads,) fp32; norm_weight (nheads * head_dim,); state_slots (batch,) int64
Supported ranges and dtypes: ops/support.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_nemotron_h.ops import launch_config as configs
from vllm_nemotron_h.ops.causal_conv1d_update import interface as conv_op
from vllm_nemotron_h.ops.causal_conv1d_update import kernel as conv_kernel
from vllm_nemotron_h.ops.deferred_state_update import interface as deferred_op
from vllm_nemotron_h.ops.deferred_state_update import kernel as deferred_kernel
from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState
from vllm_nemotron_h.ops.mamba2_decode import kernel
from vllm_nemotron_h.ops.mamba2_decode.args import (
    DecodeLayer,
    DecodeStep,
    conv_step,
    group_norm,
    state_update_step,
)
from vllm_nemotron_h.ops.mamba2_decode.cpu import mamba2_decode_cpu
from vllm_nemotron_h.ops.mamba2_decode.kernel import MIN_BLOCK_M, DecodeWorkspace
from vllm_nemotron_h.ops.mamba2_decode.layout import ngroups_of
from vllm_nemotron_h.ops.rms_norm import kernel as norm_kernel
from vllm_nemotron_h.ops.selective_state_update import interface as ssu_op
from vllm_nemotron_h.ops.selective_state_update import kernel as ssu_kernel
from vllm_nemotron_h.ops.support import (
    ACTIVATION_DTYPES,
    ANY_STATE_DTYPES,
    CONV_WIDTH_RANGE,
    D_STATE_RANGE,
    HEAD_DIM_RANGE,
    STATE_DTYPES,
    check_range,
    check_slots,
    check_tensor,
    use_triton,
)

# Without a device table: the one launch up to this batch x heads (its H100 crossover).
DEFAULT_FUSED_MAX_BATCH_HEADS = 1024


@dataclass(frozen=True)
class DecodeShape:
    """What the launch choice depends on besides the batch: one Mamba layer's per-rank shape."""

    nheads: int
    head_dim: int
    d_state: int
    ngroups: int
    width: int
    state_dtype: torch.dtype
    device: torch.device
    ring_size: int = 0  # deferred writes' ring (0: the state written every token)

    @classmethod
    def of(cls, xbc: torch.Tensor, layer: DecodeLayer):
        _, nheads, head_dim, d_state = layer.ssm_state.shape
        ngroups = ngroups_of(xbc.shape[1], nheads, head_dim, d_state)
        ring = layer.deferred.ring_size if layer.deferred is not None else 0
        return cls(
            nheads, head_dim, d_state, ngroups, layer.conv_weight.shape[1],
            layer.ssm_state.dtype, xbc.device, ring,
        )  # fmt: skip

    @property
    def group_rows(self) -> int:
        return self.nheads * self.head_dim // self.ngroups

    @property
    def conv_dim(self) -> int:
        return self.nheads * self.head_dim + 2 * self.ngroups * self.d_state

    def tile_config(self, kernel: str, batch_heads: int) -> tuple[int, int, int]:
        """(BLOCK_M, num_warps, tiles per program) of ``kernel``'s (head, row) tiles, from the
        device's table."""
        return configs.plane_tile_config(
            kernel, self.device, self.head_dim, self.d_state, self.state_dtype, batch_heads,
            self.group_rows,
        )  # fmt: skip


@dataclass(frozen=True)
class DecodeLaunch:
    """How one batch size runs: the fused launch's tile or the three kernels' configs."""

    fused: bool
    fused_config: tuple[int, int]  # (BLOCK_M, num_warps) of the fused kernel
    conv_config: tuple[int, int]  # (BLOCK_D, num_warps) of the conv kernel
    # (BLOCK_M, num_warps[, tiles per program]) of the (deferred) state-update kernel
    ssu_config: tuple[int, ...]
    # With deferred writes: whether this batch defers (the three kernels with the deferred
    # update), where the device table says deferring pays and the tail is not fused; else
    # the layer runs its per-step launch at this batch, the rings empty
    defers: bool = False

    def workspace_needs(self, shape: DecodeShape, batch: int) -> tuple[int, int]:
        """(counters, partial sums) the fused launch needs at ``batch``."""
        n_tiles = shape.nheads * shape.head_dim // self.fused_config[0]
        return batch * shape.ngroups, batch * n_tiles


def _fused_tile_fits(shape: DecodeShape, block_m: int) -> bool:
    # A group of heads x head_dim rows without a power-of-two divisor >= MIN_BLOCK_M (e.g.
    # head_dim 34, one head per group) cannot be tiled for the one launch.
    return shape.group_rows % block_m == 0 and block_m >= MIN_BLOCK_M


@configs.cached
def resolve_launch(shape: DecodeShape, batch: int) -> DecodeLaunch:
    """The device table's choice for ``batch`` sequences."""
    batch_heads = batch * shape.nheads
    fused_config = shape.tile_config("mamba2_decode", batch_heads)[:2]  # one tile a program
    fused_max = configs.table("mamba2_decode_fused_max_batch_heads", shape.device)
    fused_max = DEFAULT_FUSED_MAX_BATCH_HEADS if fused_max is None else fused_max
    fused = _fused_tile_fits(shape, fused_config[0]) and batch_heads <= fused_max
    defers = False
    if shape.ring_size:  # tiles of one head's rows
        ssu_config = deferred_op.launch_config(
            shape.device, shape.head_dim, shape.d_state, shape.state_dtype, batch_heads
        )
        defers = not fused and deferred_op.pays(
            shape.device, shape.head_dim, shape.d_state, shape.state_dtype, batch_heads
        )
    else:
        ssu_config = shape.tile_config("selective_state_update", batch_heads)
    return DecodeLaunch(
        fused=fused and not shape.ring_size,  # the fused launch writes the state every token
        fused_config=fused_config,
        conv_config=conv_op.launch_config(shape.device, batch * shape.conv_dim),
        ssu_config=ssu_config,
        defers=defers,
    )


def check(layer: DecodeLayer, step: DecodeStep) -> None:
    """Raises ValueError naming the first argument that does not fit."""
    xbc, ssm_state, conv_weight = step.xbc, layer.ssm_state, layer.conv_weight
    check_tensor("xbc", xbc, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    batch, conv_dim = xbc.shape
    dev = xbc.device
    check_tensor("ssm_state", ssm_state, (None, None, None, None), ANY_STATE_DTYPES, dev, True)
    ssu_op.check_state_scale(ssm_state, layer.ssm_scale, "ssm_state", "ssm_scale")
    _, nheads, head_dim, d_state = ssm_state.shape
    check_range("head_dim", head_dim, HEAD_DIM_RANGE)
    check_range("d_state", d_state, D_STATE_RANGE)
    inner = nheads * head_dim
    bc_dim = conv_dim - inner
    ngroups = bc_dim // (2 * d_state)
    if bc_dim <= 0 or bc_dim % (2 * d_state) or nheads % ngroups:
        raise ValueError(
            f"xbc.shape[1]={conv_dim} must be nheads*head_dim ({inner}) + 2*ngroups*d_state "
            f"(d_state={d_state}) with ngroups dividing nheads={nheads}"
        )
    check_tensor("dt", step.dt, (batch, nheads), ACTIVATION_DTYPES, dev)
    check_tensor("z", step.z, (batch, inner), ACTIVATION_DTYPES, dev, True)
    check_tensor("conv_weight", conv_weight, (conv_dim, None), ACTIVATION_DTYPES, dev)
    width = conv_weight.shape[1]
    check_range("conv_weight.shape[1] (conv width)", width, CONV_WIDTH_RANGE)
    check_tensor("conv_state", layer.conv_state, (None, conv_dim, width - 1), STATE_DTYPES, dev)
    if layer.conv_bias is not None:
        check_tensor("conv_bias", layer.conv_bias, (conv_dim,), ACTIVATION_DTYPES, dev)
    for name, t in (("A", layer.A), ("D", layer.D), ("dt_bias", layer.dt_bias)):
        check_tensor(name, t, (nheads,), (torch.float32,), dev)
    if layer.norm_weight is not None:
        check_tensor("norm_weight", layer.norm_weight, (inner,), ACTIVATION_DTYPES, dev)
    check_slots(step.state_slots, batch, dev)
    if step.out is not None:
        check_tensor("out", step.out, (batch, inner), (xbc.dtype,), dev, True)
    if layer.deferred is not None:
        deferred_op.check_state(layer.deferred, dev)
        if layer.deferred.checkpoint is not ssm_state or (
            layer.deferred.checkpoint_scale is not layer.ssm_scale
        ):
            raise ValueError("deferred must have ssm_state and ssm_scale as its checkpoint")


def check_workspace(
    workspace: DecodeWorkspace | None, counters: int, partial_sums: int, device: torch.device
) -> None:
    """Raises ValueError unless ``workspace`` holds that many of each on ``device``."""
    if (
        workspace is not None
        and workspace.counters.numel() >= counters
        and workspace.partial_sums.numel() >= partial_sums
        and workspace.counters.device == device
    ):
        return
    have = (
        "None"
        if workspace is None
        else f"{workspace.counters.numel()} counters and {workspace.partial_sums.numel()} "
        f"partial sums on {workspace.counters.device}"
    )
    raise ValueError(
        f"workspace holds {have}; the fused launch needs a DecodeWorkspace with {counters} "
        f"and {partial_sums} on {device}"
    )


def run(
    launch: DecodeLaunch, layer: DecodeLayer, step: DecodeStep, workspace: DecodeWorkspace | None
) -> torch.Tensor:
    """Runs a resolved launch on the GPU (or the Triton interpreter), ``step.out`` given;
    no checks."""
    if launch.fused:
        return kernel.launch(layer, step, workspace, *launch.fused_config)
    xbc, out = step.xbc, step.out
    conv = torch.empty(xbc.shape, dtype=xbc.dtype, device=xbc.device)
    conv_kernel.launch(conv_step(layer, step, conv), *launch.conv_config)
    ssu_step = state_update_step(layer, step, conv, out)
    if layer.deferred is not None:
        deferred_kernel.launch(layer.deferred, ssu_step, *launch.ssu_config)
    else:
        ssu_kernel.launch(layer.ssm_state, layer.ssm_scale, ssu_step, *launch.ssu_config)
    if layer.norm_weight is not None:
        norm_kernel.launch_group(out, group_norm(layer, ssu_step.B.shape[1]), out=out)
    return out


def mamba2_decode(
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
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    workspace: DecodeWorkspace | None = None,
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    config: tuple[int, int] | None = None,
    fuse: bool | None = None,
    ssm_scale: torch.Tensor | None = None,
    deferred: DeferredState | None = None,
) -> torch.Tensor:
    """Advances both states of every sequence by one token in place and returns ``out``
    (batch, nheads * head_dim): normalised when ``norm_weight`` is given, else gated y.
    ``fuse``: one launch (True), the three ops' kernels (False), or the device table's
    choice (None). The one launch needs ``workspace``; ``config`` = (BLOCK_M, num_warps)
    overrides its table. ``ssm_scale`` holds the per-row scales of an int8 ``ssm_state``
    (updated in place with it). ``deferred``: the state with deferred writes whose
    checkpoint is ``ssm_state`` (and ``ssm_scale``); three ops, never the one launch."""
    layer = DecodeLayer(
        conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias, norm_weight, eps,
        ssm_scale, null_slot, deferred,
    )  # fmt: skip
    step = DecodeStep(xbc, dt, z, state_slots, out)
    check(layer, step)
    if deferred is not None and (fuse or config is not None):
        raise ValueError("deferred writes run the three ops: fuse and config must be None")
    if out is None:
        step.out = torch.empty_like(z)
    if not use_triton(xbc):
        return mamba2_decode_cpu(layer, step)
    shape = DecodeShape.of(xbc, layer)
    batch = xbc.shape[0]
    launch = resolve_launch(shape, batch)
    if config is not None or fuse is not None:
        fused_config = config or launch.fused_config
        if (config is not None or fuse) and not _fused_tile_fits(shape, fused_config[0]):
            raise ValueError(
                f"BLOCK_M={fused_config[0]} must be >= {MIN_BLOCK_M} and divide heads per "
                f"group x head_dim = {shape.group_rows} for the fused launch"
            )
        fused = launch.fused if fuse is None else fuse
        launch = DecodeLaunch(fused, fused_config, launch.conv_config, launch.ssu_config)
    if launch.fused:
        check_workspace(workspace, *launch.workspace_needs(shape, batch), xbc.device)
    return run(launch, layer, step, workspace)
