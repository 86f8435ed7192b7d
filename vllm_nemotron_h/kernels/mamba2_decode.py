"""The decode tail of a Mamba2 layer in one launch: conv update -> state update -> gated
group norm.

For every sequence ``b`` (``slot_b = state_slots[b]``)::

    xbc' = silu(causal_conv1d_update(xbc[b], conv_state[slot_b]))     (rolls conv_state)
    x, B, C = split(xbc', [nheads * head_dim, ngroups * d_state, ngroups * d_state])
    y    = selective_state_update(ssm_state[slot_b], x, dt, A, B, C, D, dt_bias, z)
    out  = group_rms_norm(y, norm_weight, heads per group x head_dim, eps)   (when given)

exactly the composition of the three kernels of this folder (``mamba2_decode_ref``), with the
same roundings: the conv output and y are rounded to the activation dtype where the separate
kernels store them. Without ``norm_weight`` the output is the gated y (the norm then runs
apart, e.g. when its group spans tensor-parallel ranks).

Shapes and dtypes:
    xbc         (batch, nheads * head_dim + 2 * ngroups * d_state)   activation dtype, rows
                may be strided (a view of the input projection)
    dt          (batch, nheads); z, out (batch, nheads * head_dim)    activation dtype
    conv_state  (num_slots, conv_dim, width - 1)                      any strides
    conv_weight (conv_dim, width), conv_bias (conv_dim,)              width 2..4
    ssm_state   (num_slots, nheads, head_dim, d_state)                fp32 / bf16 / fp16
    A, D, dt_bias (nheads,) fp32; norm_weight (nheads * head_dim,); state_slots (batch,) int64

One program owns BLOCK_M consecutive rows of the (head, row) plane of one sequence, inside
one group, as in ``selective_state_update``: it convolves its own x channels (and rolls their
conv state) and the B and C channels of its group, which every program of the group needs.
The B and C windows may be rolled only once all of the group's programs have read them, and
the group's norm needs the sum of squares of all its rows: each program adds itself to an
arrival counter per (sequence, group) after its reads and stores, and the last to arrive
rolls the B and C windows, rescales the group's rows (from L2) and resets the counter to
zero for the next launch. The counters and the per-tile partial sums live in a
``DecodeWorkspace`` allocated once; partial sums are added in a fixed order, so the result
does not depend on which program arrives last.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vllm_nemotron_h.kernels._common import (
    ACTIVATION_DTYPES,
    STATE_DTYPES,
    check_range,
    check_slots,
    check_tensor,
    use_triton,
)
from vllm_nemotron_h.kernels.causal_conv1d_update import (
    _conv_shift,
    _conv_window,
    causal_conv1d_update_ref,
    launch_causal_conv1d_update,
)
from vllm_nemotron_h.kernels.rms_norm import group_rms_norm_ref, launch_group_rms_norm
from vllm_nemotron_h.kernels.selective_state_update import (
    _plane_tile,
    _state_step,
    config_from_table,
    launch_selective_state_update,
    selective_state_update_ref,
)

_BIG = 1 << 62
# The smallest tile the workspace is sized for: one partial sum per MIN_BLOCK_M rows.
MIN_BLOCK_M = 4
# Up to this many batch x heads the one launch beats the three kernels of this folder in a
# row; above it their tail runs instead. benchmarks/kernels.py on the H100 (NOTES.md): the one
# launch is 1.2-1.4x faster at batch 1 and 1.0-1.2x at batch 8 (128 and 64 heads), 0.94-1.0x
# from batch 32 on, where its per-program arrival (barrier, atomic) and the group's B and C
# windows every program convolves cost more than two launches.
FUSED_MAX_BATCH_HEADS = 1024
# (head_dim, d_state, state bytes) -> [(max batch*nheads, BLOCK_M, num_warps)], as in
# selective_state_update.TUNED_CONFIGS: the sweep of `kernels.py --tune mamba2_decode` on the
# H100 at batch 1, 8, 32 (benchmarks/results/kernel-tuning-fused-h100.json) as
# `kernels.py --tables` derives it.
TUNED_CONFIGS: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {
    (64, 128, 4): [(128, 16, 4), (512, 32, 1), (2048, 64, 2), (_BIG, 128, 4)],
    (64, 128, 2): [(64, 32, 4), (128, 128, 4), (512, 64, 2), (_BIG, 128, 4)],
    (80, 128, 4): [(128, 16, 4), (_BIG, 64, 2)],
    (80, 128, 2): [(_BIG, 128, 4)],
}


@functools.cache
def launch_config(
    head_dim: int, d_state: int, state_dtype: torch.dtype, batch_heads: int, group_rows: int
) -> tuple[int, int]:
    """(BLOCK_M, num_warps) of the fused kernel for one launch."""
    return config_from_table(TUNED_CONFIGS, head_dim, d_state, state_dtype, batch_heads, group_rows)


@dataclass
class DecodeWorkspace:
    """Scratch of ``mamba2_decode`` for up to ``max_batch`` sequences; allocate it once (CUDA
    graphs replay its addresses) and share it between layers: every launch leaves the
    counters at zero, and launches on one stream do not overlap."""

    counters: torch.Tensor  # int32 (max_batch * nheads,): arrivals per (sequence, group)
    partial_sums: torch.Tensor  # fp32 (max_batch * nheads * head_dim / MIN_BLOCK_M,)

    @classmethod
    def allocate(
        cls, max_batch: int, nheads: int, head_dim: int, device: torch.device | str
    ) -> DecodeWorkspace:
        # ngroups <= nheads, and tiles have at least MIN_BLOCK_M rows.
        return cls(
            torch.zeros(max_batch * nheads, dtype=torch.int32, device=device),
            torch.zeros(
                max_batch * nheads * head_dim // MIN_BLOCK_M, dtype=torch.float32, device=device
            ),
        )

    @staticmethod
    def check(
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


@triton.jit
def _mamba2_decode_kernel(
    xbc_ptr,
    dt_ptr,
    z_ptr,
    conv_state_ptr,
    conv_w_ptr,
    conv_b_ptr,
    state_ptr,
    A_ptr,
    D_ptr,
    dt_bias_ptr,
    norm_w_ptr,
    out_ptr,
    slots_ptr,
    counters_ptr,
    partials_ptr,
    null_slot,
    d_state,
    ngroups,
    group_rows,
    eps,
    xbc_b,
    dt_b,
    dt_h,
    z_b,
    cs_slot,
    cs_dim,
    cs_t,
    cw_dim,
    cw_t,
    s_slot,
    s_head,
    s_dim,
    o_b,
    HEAD_DIM: tl.constexpr,
    WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILES_BLOCK: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
):
    tile = tl.program_id(0)
    n_tiles = tl.num_programs(0)
    b = tl.program_id(1).to(tl.int64)
    first_row = tile * BLOCK_M
    g = first_row // group_rows  # BLOCK_M divides group_rows: one group per program
    inner = n_tiles * BLOCK_M  # nheads * head_dim: x channels come first in xbc
    slot, rows, h, p, cols, col_ok, live, tile_ok = _plane_tile(
        slots_ptr, b, first_row, null_slot, d_state, HEAD_DIM, HAS_SLOTS, BLOCK_M, BLOCK_N
    )
    bc_ok = col_ok & ((cols * 0 + slot) != null_slot)  # the group's B and C channels

    # Every load before the arithmetic: the state tile, the conv windows of the tile's x
    # channels and of its group's B and C channels, then the per-row values.
    state_ptrs = state_ptr + slot * s_slot + (h * s_head + p * s_dim)[:, None] + cols[None, :]
    s = tl.load(state_ptrs, mask=tile_ok, other=0.0)
    xbc_row = xbc_ptr + b * xbc_b
    cs_base = conv_state_ptr + slot * cs_slot
    x_st = cs_base + rows * cs_dim
    b_ch = inner + g * d_state + cols
    c_ch = b_ch + ngroups * d_state
    b_st = cs_base + b_ch * cs_dim
    c_st = cs_base + c_ch * cs_dim
    x_conv, x_w1, x_w2, x_new = _conv_window(
        xbc_row,
        x_st,
        cs_t,
        rows,
        rows < inner,
        live,
        conv_w_ptr,
        cw_dim,
        cw_t,
        conv_b_ptr,
        WIDTH,
        HAS_BIAS,
    )
    b_conv, b_w1, b_w2, b_new = _conv_window(
        xbc_row,
        b_st,
        cs_t,
        b_ch,
        col_ok,
        bc_ok,
        conv_w_ptr,
        cw_dim,
        cw_t,
        conv_b_ptr,
        WIDTH,
        HAS_BIAS,
    )
    c_conv, c_w1, c_w2, c_new = _conv_window(
        xbc_row,
        c_st,
        cs_t,
        c_ch,
        col_ok,
        bc_ok,
        conv_w_ptr,
        cw_dim,
        cw_t,
        conv_b_ptr,
        WIDTH,
        HAS_BIAS,
    )
    z = tl.load(z_ptr + b * z_b + rows).to(tl.float32)
    dt = tl.load(dt_ptr + b * dt_b + h * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + h)
    A = tl.load(A_ptr + h)
    D = tl.load(D_ptr + h)

    # The conv outputs, rounded where the separate conv kernel stores them.
    act = xbc_ptr.dtype.element_ty
    x = (x_conv * tl.sigmoid(x_conv)).to(act).to(tl.float32)
    Bv = (b_conv * tl.sigmoid(b_conv)).to(act).to(tl.float32)
    Cv = (c_conv * tl.sigmoid(c_conv)).to(act).to(tl.float32)
    _conv_shift(x_st, cs_t, x_w1, x_w2, x_new, live, WIDTH)

    s = _state_step(s, x, Bv, dt, A)
    tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=tile_ok)
    y = tl.sum(s * Cv[None, :], axis=1) + D * x
    y = tl.where(live, y * z * tl.sigmoid(z), 0.0).to(out_ptr.dtype.element_ty)
    out_row = out_ptr + b * o_b
    tl.store(out_row + rows, y)
    if NORM:
        yf = y.to(tl.float32)
        tl.store(partials_ptr + b * n_tiles + tile, tl.sum(yf * yf, axis=0))

    # All of this program's reads and stores are done before it counts itself in.
    tl.debug_barrier()
    counter = counters_ptr + b * ngroups + g
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    tiles_per_group = group_rows // BLOCK_M
    if arrived == tiles_per_group - 1:
        _conv_shift(b_st, cs_t, b_w1, b_w2, b_new, bc_ok, WIDTH)
        _conv_shift(c_st, cs_t, c_w1, c_w2, c_new, bc_ok, WIDTH)
        if NORM:
            # The group's partial sums and rows are loaded together (one round trip), from
            # L2 (.cg): other programs stored them, a stale L1 line must not answer.
            t = tl.arange(0, TILES_BLOCK)
            sq = tl.load(
                partials_ptr + b * n_tiles + g * tiles_per_group + t,
                mask=t < tiles_per_group,
                other=0.0,
                cache_modifier=".cg",
            )
            c = tl.arange(0, GROUP_BLOCK)
            c_ok = c < group_rows
            c += g * group_rows
            v = tl.load(out_row + c, mask=c_ok, other=0.0, cache_modifier=".cg")
            w = tl.load(norm_w_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / group_rows + eps)
            tl.store(out_row + c, (v.to(tl.float32) * rstd * w).to(v.dtype), mask=c_ok)
        tl.store(counter, 0)


def _three_steps(
    conv_update,
    state_update,
    group_norm,
    xbc,
    dt,
    z,
    conv_state,
    conv_weight,
    conv_bias,
    ssm_state,
    A,
    D,
    dt_bias,
    norm_weight,
    eps,
    state_slots,
    null_slot,
    out,
) -> torch.Tensor:
    """conv update -> state update with gate -> group norm, with the given three functions
    (this folder's kernels, or their references)."""
    batch = xbc.shape[0]
    _, nheads, head_dim, d_state = ssm_state.shape
    inner = nheads * head_dim
    ngroups = (xbc.shape[1] - inner) // (2 * d_state)
    conv = torch.empty(xbc.shape, dtype=xbc.dtype, device=xbc.device)
    conv_update(xbc, conv_state, conv_weight, conv_bias, "silu", state_slots, null_slot, conv)
    x, B, C = torch.split(conv, [inner, ngroups * d_state, ngroups * d_state], dim=-1)
    if out is None:
        out = torch.empty_like(z)
    state_update(
        ssm_state,
        x.reshape(batch, nheads, head_dim),
        dt,
        A,
        B.reshape(batch, ngroups, d_state),
        C.reshape(batch, ngroups, d_state),
        D,
        dt_bias,
        z.reshape(batch, nheads, head_dim),
        state_slots,
        null_slot,
        out.view(batch, nheads, head_dim),
    )
    if norm_weight is not None:
        group_norm(out, norm_weight, inner // ngroups, eps, out=out)
    return out


def mamba2_decode_ref(
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
) -> torch.Tensor:
    """The three references composed, same signature and effects (the CPU path and the test
    oracle); ``workspace`` is not used."""
    return _three_steps(
        causal_conv1d_update_ref,
        selective_state_update_ref,
        group_rms_norm_ref,
        xbc,
        dt,
        z,
        conv_state,
        conv_weight,
        conv_bias,
        ssm_state,
        A,
        D,
        dt_bias,
        norm_weight,
        eps,
        state_slots,
        null_slot,
        out,
    )


def _check(
    xbc, dt, z, conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias,
    norm_weight, state_slots, out,
) -> None:  # fmt: skip
    """Raises ValueError naming the first argument that does not fit."""
    check_tensor("xbc", xbc, (None, None), ACTIVATION_DTYPES, unit_last_stride=True)
    batch, conv_dim = xbc.shape
    dev = xbc.device
    check_tensor("ssm_state", ssm_state, (None, None, None, None), STATE_DTYPES, dev, True)
    _, nheads, head_dim, d_state = ssm_state.shape
    check_range("head_dim", head_dim, 32, 128)
    check_range("d_state", d_state, 16, 256)
    inner = nheads * head_dim
    bc_dim = conv_dim - inner
    ngroups = bc_dim // (2 * d_state)
    if bc_dim <= 0 or bc_dim % (2 * d_state) or nheads % ngroups:
        raise ValueError(
            f"xbc.shape[1]={conv_dim} must be nheads*head_dim ({inner}) + 2*ngroups*d_state "
            f"(d_state={d_state}) with ngroups dividing nheads={nheads}"
        )
    check_tensor("dt", dt, (batch, nheads), ACTIVATION_DTYPES, dev)
    check_tensor("z", z, (batch, inner), ACTIVATION_DTYPES, dev, True)
    check_tensor("conv_weight", conv_weight, (conv_dim, None), ACTIVATION_DTYPES, dev)
    width = conv_weight.shape[1]
    check_range("conv_weight.shape[1] (conv width)", width, 2, 4)
    check_tensor("conv_state", conv_state, (None, conv_dim, width - 1), STATE_DTYPES, dev)
    if conv_bias is not None:
        check_tensor("conv_bias", conv_bias, (conv_dim,), ACTIVATION_DTYPES, dev)
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_tensor(name, t, (nheads,), (torch.float32,), dev)
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, (inner,), ACTIVATION_DTYPES, dev)
    check_slots(state_slots, batch, dev)
    if out is not None:
        check_tensor("out", out, (batch, inner), (xbc.dtype,), dev, True)


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
    check: bool = True,
) -> torch.Tensor:
    """Advances both states of every sequence by one token in place and returns ``out``
    (batch, nheads * head_dim): normalised when ``norm_weight`` is given, else gated y.
    ``fuse``: one launch (True), the three kernels of this folder (False), or whichever is
    faster at this batch (None: fused up to FUSED_MAX_BATCH_HEADS). The one launch needs
    ``workspace``; ``config`` = (BLOCK_M, num_warps) overrides its tuned configuration.
    ``check=False`` skips the argument checks, for a caller that checked the same tensors
    before (a Mamba layer after its first decode step: the state cache, weights and the views'
    layout do not change between steps, only the batch); a ``config`` or ``fuse`` the shape
    cannot take and a missing or too small workspace still raise."""
    if check:
        _check(
            xbc, dt, z, conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias,
            norm_weight, state_slots, out,
        )  # fmt: skip
    args = [xbc, dt, z, conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias]
    args += [norm_weight, eps, state_slots, null_slot, out]  # _three_steps' order
    batch, conv_dim = xbc.shape
    _, nheads, head_dim, d_state = ssm_state.shape
    inner = nheads * head_dim
    ngroups = (conv_dim - inner) // (2 * d_state)
    width = conv_weight.shape[1]
    group_rows = inner // ngroups
    if out is None:
        out = args[-1] = torch.empty_like(z)
    block_m, num_warps = config or launch_config(
        head_dim, d_state, ssm_state.dtype, batch * nheads, group_rows
    )
    # A group of heads x head_dim rows without a power-of-two divisor >= MIN_BLOCK_M (e.g.
    # head_dim 34, one head per group) cannot be tiled for the one launch.
    tile_fits = group_rows % block_m == 0 and block_m >= MIN_BLOCK_M
    if not tile_fits and (config is not None or fuse):
        raise ValueError(
            f"BLOCK_M={block_m} must be >= {MIN_BLOCK_M} and divide heads per group x head_dim "
            f"= {group_rows} for the fused launch"
        )
    if fuse is None:
        fuse = tile_fits and batch * nheads <= FUSED_MAX_BATCH_HEADS
    n_tiles = inner // block_m
    on_triton = use_triton(xbc)
    if on_triton and fuse:
        DecodeWorkspace.check(workspace, batch * ngroups, batch * n_tiles, xbc.device)
    if not on_triton:
        return _three_steps(
            causal_conv1d_update_ref, selective_state_update_ref, group_rms_norm_ref, *args
        )
    if not fuse:  # the three launches: _check covered what their own checks would
        return _three_steps(
            launch_causal_conv1d_update,
            launch_selective_state_update,
            launch_group_rms_norm,
            *args,
        )
    if batch == 0:
        return out
    _mamba2_decode_kernel[(n_tiles, batch)](
        xbc,
        dt,
        z,
        conv_state,
        conv_weight,
        conv_bias if conv_bias is not None else conv_weight,
        ssm_state,
        A,
        D,
        dt_bias,
        norm_weight if norm_weight is not None else A,
        out,
        state_slots if state_slots is not None else dt,
        workspace.counters,
        workspace.partial_sums,
        null_slot,
        d_state,
        ngroups,
        group_rows,
        eps,
        xbc.stride(0),
        dt.stride(0),
        dt.stride(1),
        z.stride(0),
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        conv_weight.stride(0),
        conv_weight.stride(1),
        ssm_state.stride(0),
        ssm_state.stride(1),
        ssm_state.stride(2),
        out.stride(0),
        HEAD_DIM=head_dim,
        WIDTH=width,
        HAS_BIAS=conv_bias is not None,
        HAS_SLOTS=state_slots is not None,
        NORM=norm_weight is not None,
        BLOCK_M=block_m,
        BLOCK_N=triton.next_power_of_2(d_state),
        TILES_BLOCK=triton.next_power_of_2(n_tiles // ngroups),
        GROUP_BLOCK=triton.next_power_of_2(group_rows),
        num_warps=num_warps,
    )
    return out
