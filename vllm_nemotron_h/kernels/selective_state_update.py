"""Selective state update: one decode step of a Mamba2 layer, all math in fp32 registers.

For every sequence ``b``, head ``h``, row ``p`` of the head and state column ``n``::

    dt'   = softplus(dt[b, h] + dt_bias[h])
    s     = state[slot_b, h, p, n] * exp(A[h] * dt') + dt' * B[b, g, n] * x[b, h, p]
    y     = sum_n s * C[b, g, n] + D[h] * x[b, h, p]
    y    *= silu(z[b, h, p])                       (when z is given)
    state[slot_b, h, p, n] = s ;  out[b, h, p] = y

with ``g = h // (nheads // ngroups)`` and ``slot_b = state_slots[b]`` (``b`` itself when no
slots are given). Rows whose slot equals ``null_slot`` (vLLM's padding) neither read nor
write the state; their output is zero.

Shapes and dtypes:
    state      (num_slots, nheads, head_dim, d_state)  fp32 / bf16 / fp16, updated in place
    x, z, out  (batch, nheads, head_dim)               activation dtype (fp32 / bf16 / fp16)
    dt         (batch, nheads)                          activation dtype
    A, D, dt_bias (nheads,)                             fp32; A = -exp(A_log), computed at load
    B, C       (batch, ngroups, d_state)                activation dtype
    state_slots (batch,)                                int64
Supported: d_state 16..256, head_dim 32..128 (80 included), ngroups dividing nheads.

One Triton program owns BLOCK_M consecutive rows of the (head, row) plane of one sequence:
a block may span several heads (head_dim 80 takes 32- or 64-row tiles without masked rows)
but never two groups, so B and C are loaded once per program. Each program reads its state
tile once and writes it once: the kernel moves the minimum number of bytes.
"""

from __future__ import annotations

import functools

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

# (head_dim, d_state, state bytes) -> list of (max batch*nheads, BLOCK_M, num_warps): the best
# of the sweep in benchmarks/kernels.py --tune on the H100 over the three real shapes
# (benchmarks/results/kernel-tuning-h100.json, benchmarks/NOTES.md), as `kernels.py --tables`
# derives it from that sweep. Tuned on copies of the state: tuning on the live state would
# advance it. Shapes not listed use _default_config.
_BIG = 1 << 62
TUNED_CONFIGS: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {
    (64, 128, 4): [(64, 4, 1), (2048, 32, 1), (4096, 8, 1), (8192, 64, 2), (_BIG, 16, 4)],
    (64, 128, 2): [(128, 4, 1), (512, 32, 1), (2048, 16, 1), (8192, 32, 1), (_BIG, 64, 2)],
    (80, 128, 4): [(128, 32, 1), (1024, 4, 1), (8192, 16, 2), (16384, 16, 4), (_BIG, 32, 4)],
    (80, 128, 2): [(1024, 32, 1), (8192, 16, 1), (_BIG, 64, 2)],
}


def _largest_tile(block_m: int, group_rows: int) -> int:
    # A tile never spans two groups: the largest power of two <= block_m dividing group_rows.
    while group_rows % block_m:
        block_m //= 2
    return block_m


def _default_config(d_state: int, state_bytes: int) -> tuple[int, int]:
    # Aim for about 8 KB of state per program: enough bytes in flight per SM, enough programs.
    block_n = triton.next_power_of_2(d_state)
    return max(4, min(64, 8192 // (block_n * state_bytes))), 4


def config_from_table(
    table: dict[tuple[int, int, int], list[tuple[int, int, int]]],
    head_dim: int,
    d_state: int,
    state_dtype: torch.dtype,
    batch_heads: int,
    group_rows: int,
) -> tuple[int, int]:
    """(BLOCK_M, num_warps) from a table keyed like TUNED_CONFIGS; ``group_rows`` = heads per
    group x head_dim (a tile never spans two groups)."""
    state_bytes = state_dtype.itemsize
    block_m, warps = _default_config(d_state, state_bytes)
    for max_bh, tuned_m, tuned_warps in table.get((head_dim, d_state, state_bytes), []):
        if batch_heads <= max_bh:
            block_m, warps = tuned_m, tuned_warps
            break
    return _largest_tile(block_m, group_rows), warps


# Cached: eager and mixed prefill/decode steps call it per Mamba layer (CUDA graphs do not).
@functools.cache
def launch_config(
    head_dim: int, d_state: int, state_dtype: torch.dtype, batch_heads: int, group_rows: int
) -> tuple[int, int]:
    """(BLOCK_M, num_warps) of this kernel for one launch."""
    return config_from_table(TUNED_CONFIGS, head_dim, d_state, state_dtype, batch_heads, group_rows)


@triton.jit
def _state_step(s, x, Bv, dt, A):
    """One token of the recurrence for a tile of rows, in fp32: ``s`` (rows, d_state) the old
    state, ``x``, ``dt`` (dt + dt_bias, before softplus) and ``A`` per row, ``Bv`` (d_state,).
    Returns the new state; callers store it before they reduce y = s . C + D x."""
    dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)  # softplus
    decay = tl.exp(A * dt)
    return s.to(tl.float32) * decay[:, None] + (dt * x)[:, None] * Bv[None, :]


@triton.jit
def _plane_tile(slots_ptr, b, first_row, null_slot, d_state, HEAD_DIM, HAS_SLOTS, BLOCK_M, BLOCK_N):
    """A program's tile of the (head, row) plane of sequence ``b``: its state slot, its rows,
    their head ``h`` and row ``p``, the state columns, and the masks (``live``: the slot is not
    the null slot)."""
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b)
    else:
        slot = b
    rows = first_row + tl.arange(0, BLOCK_M)
    h = (rows // HEAD_DIM).to(tl.int64)
    p = rows % HEAD_DIM
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < d_state
    # Per-row copy of the slot test (a scalar mask breaks the Triton interpreter).
    live = (rows * 0 + slot) != null_slot
    tile_ok = live[:, None] & col_ok[None, :]
    return slot, rows, h, p, cols, col_ok, live, tile_ok


@triton.jit
def _selective_state_update_kernel(
    state_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    dt_bias_ptr,
    z_ptr,
    out_ptr,
    slots_ptr,
    null_slot,
    d_state,
    group_rows,
    s_slot,
    s_head,
    s_dim,
    x_b,
    x_h,
    x_d,
    dt_b,
    dt_h,
    B_b,
    B_g,
    B_n,
    C_b,
    C_g,
    C_n,
    z_b,
    z_h,
    z_d,
    o_b,
    o_h,
    o_d,
    HEAD_DIM: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    first_row = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    g = first_row // group_rows  # BLOCK_M divides group_rows: one group per program
    slot, rows, h, p, cols, col_ok, live, tile_ok = _plane_tile(
        slots_ptr, b, first_row, null_slot, d_state, HEAD_DIM, HAS_SLOTS, BLOCK_M, BLOCK_N
    )

    # Issue every load before the arithmetic that needs it.
    row_offsets = h * s_head + p * s_dim
    state_ptrs = state_ptr + slot * s_slot + row_offsets[:, None] + cols[None, :]
    s = tl.load(state_ptrs, mask=tile_ok, other=0.0)
    x = tl.load(x_ptr + b * x_b + h * x_h + p * x_d).to(tl.float32)
    Bv = tl.load(B_ptr + b * B_b + g * B_g + cols * B_n, mask=col_ok, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * C_b + g * C_g + cols * C_n, mask=col_ok, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + b * z_b + h * z_h + p * z_d).to(tl.float32)
    dt = tl.load(dt_ptr + b * dt_b + h * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + h)
    A = tl.load(A_ptr + h)
    D = tl.load(D_ptr + h)

    s = _state_step(s, x, Bv, dt, A)
    tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=tile_ok)
    y = tl.sum(s * Cv[None, :], axis=1) + D * x
    if HAS_Z:
        y = y * z * tl.sigmoid(z)
    y = tl.where(live, y, 0.0)
    tl.store(out_ptr + b * o_b + h * o_h + p * o_d, y.to(out_ptr.dtype.element_ty))


def selective_state_update_ref(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None = None,
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-PyTorch reference with the same signature and effects (the CPU path)."""
    batch, nheads, head_dim = x.shape
    heads_per_group = nheads // B.shape[1]
    slots = state_slots if state_slots is not None else torch.arange(batch, device=x.device)
    live = slots != null_slot
    idx = slots[live]
    s = state[idx].float()
    dt_f = torch.nn.functional.softplus(dt[live].float() + dt_bias.float())  # (n, h)
    Bh = B[live].float().repeat_interleave(heads_per_group, dim=1)  # (n, h, d_state)
    Ch = C[live].float().repeat_interleave(heads_per_group, dim=1)
    xf = x[live].float()
    decay = torch.exp(A.float() * dt_f)[..., None, None]
    s = s * decay + (dt_f[..., None] * xf)[..., None] * Bh[:, :, None, :]
    state[idx] = s.to(state.dtype)
    y = (s * Ch[:, :, None, :]).sum(-1) + D.float()[:, None] * xf
    if z is not None:
        y = y * torch.nn.functional.silu(z[live].float())
    if out is None:
        out = torch.empty_like(x)
    out.zero_()
    out[live] = y.to(out.dtype)
    return out


def _check(state, x, dt, A, B, C, D, dt_bias, z, state_slots, out) -> None:
    check_tensor("x", x, (None, None, None), ACTIVATION_DTYPES)
    batch, nheads, head_dim = x.shape
    dev = x.device
    check_tensor("state", state, (None, nheads, head_dim, None), STATE_DTYPES, dev, True)
    d_state = state.shape[-1]
    check_range("head_dim", head_dim, 32, 128)
    check_range("d_state", d_state, 16, 256)
    check_tensor("dt", dt, (batch, nheads), ACTIVATION_DTYPES, dev)
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_tensor(name, t, (nheads,), (torch.float32,), dev)
    check_tensor("B", B, (batch, None, d_state), ACTIVATION_DTYPES, dev)
    ngroups = B.shape[1]
    if ngroups == 0 or nheads % ngroups:
        raise ValueError(f"B.shape[1] (ngroups={ngroups}) must divide nheads={nheads}")
    check_tensor("C", C, (batch, ngroups, d_state), ACTIVATION_DTYPES, dev)
    if z is not None:
        check_tensor("z", z, (batch, nheads, head_dim), ACTIVATION_DTYPES, dev)
    if out is not None:
        check_tensor("out", out, (batch, nheads, head_dim), ACTIVATION_DTYPES, dev)
    check_slots(state_slots, batch, dev)


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None = None,
    state_slots: torch.Tensor | None = None,
    null_slot: int = -1,
    out: torch.Tensor | None = None,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Advances ``state`` by one token in place and returns ``out`` (see module doc).
    ``config`` = (BLOCK_M, num_warps) overrides the tuned launch configuration."""
    _check(state, x, dt, A, B, C, D, dt_bias, z, state_slots, out)
    batch, nheads, head_dim = x.shape
    group_rows = nheads // B.shape[1] * head_dim
    if config is not None and group_rows % config[0]:
        raise ValueError(
            f"config BLOCK_M={config[0]} must divide heads per group x head_dim = {group_rows}"
        )
    if out is None:
        out = torch.empty_like(x)
    if not use_triton(x):
        return selective_state_update_ref(
            state, x, dt, A, B, C, D, dt_bias, z, state_slots, null_slot, out
        )
    return launch_selective_state_update(
        state, x, dt, A, B, C, D, dt_bias, z, state_slots, null_slot, out, config
    )


def launch_selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None,
    state_slots: torch.Tensor | None,
    null_slot: int,
    out: torch.Tensor,
    config: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The Triton launch of ``selective_state_update`` without its argument checks, for a
    caller that has checked the same arguments already (``mamba2_decode``)."""
    batch, nheads, head_dim = x.shape
    group_rows = nheads // B.shape[1] * head_dim
    if batch == 0:
        return out
    d_state = state.shape[-1]
    block_m, num_warps = config or launch_config(
        head_dim, d_state, state.dtype, batch * nheads, group_rows
    )
    zz = z if z is not None else x
    grid = (nheads * head_dim // block_m, batch)
    _selective_state_update_kernel[grid](
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        zz,
        out,
        state_slots if state_slots is not None else x,
        null_slot,
        d_state,
        group_rows,
        state.stride(0),
        state.stride(1),
        state.stride(2),
        x.stride(0),
        x.stride(1),
        x.stride(2),
        dt.stride(0),
        dt.stride(1),
        B.stride(0),
        B.stride(1),
        B.stride(2),
        C.stride(0),
        C.stride(1),
        C.stride(2),
        zz.stride(0),
        zz.stride(1),
        zz.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        HEAD_DIM=head_dim,
        HAS_Z=z is not None,
        HAS_SLOTS=state_slots is not None,
        BLOCK_M=block_m,
        BLOCK_N=triton.next_power_of_2(d_state),
        num_warps=num_warps,
    )
    return out
