"""The Triton kernel of the state update with deferred writes and its launch (no checks): see
interface.py for the math and layout.py for the state.

One program owns one head of one sequence. The first tile of checkpoint rows is loaded as
soon as the slot is known, and the ring's dt and B (entries past the ring length zeroed
after the load) beside the ring length, so that the loads a step waits on come in two
rounds, not four. What the head's rows share is reduced once: the ring's B . C, the decays,
each ring token's weight. Then it walks the head's rows in tiles of BLOCK_M (the last one
masked where BLOCK_M does not divide head_dim): on a step that does not write back, a row
costs one read of its checkpoint row (and, for an int8 checkpoint, its scale) and of its ring
x: y is the checkpoint decayed over the ring, dotted with C, plus the ring's tokens weighted
by their decays and B . C. The token joins the ring (x per row; dt per head; B per group,
written by the group's first head, read by the others only from the next step on). On the
step that fills the ring (or with no token: APPEND off) the rows' state is rebuilt from the
checkpoint and the ring token by token, as the per-step update would have, and written back
in the checkpoint's format; the ring empties (a flush of an empty ring reads and writes no
state). The head's ring length is read and written by its program alone.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_nemotron_h.ops.deferred_state_update.layout import DeferredState, RingFlush
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.triton_helpers import load_state_tile, softplus, store_state_tile


@triton.jit
def _load_rows(
    state_head, scale_head, p, s_dim, cols, col_ok, live_slot, HEAD_DIM: tl.constexpr,
    QUANTIZED: tl.constexpr,
):  # fmt: skip
    """Rows ``p`` of the head's checkpoint as stored, their scales, and their masks."""
    live = live_slot & (p < HEAD_DIM)
    tile_ok = live[:, None] & col_ok[None, :]
    state_ptrs = state_head + p[:, None] * s_dim + cols[None, :]
    scale_ptrs = scale_head + p
    s, row_scale = load_state_tile(state_ptrs, scale_ptrs, tile_ok, live, QUANTIZED)
    return s, row_scale, live, tile_ok, state_ptrs, scale_ptrs


@triton.jit
def _write_back(
    state_ptrs, scale_ptrs, s, row_scale, n, A, ring_dt_ptrs, ring_x_ptrs, rx_pos, ring_B_ptrs,
    rB_pos, now_dt, now_x, now_B, col_ok, tile_ok, live, QUANTIZED: tl.constexpr,
    APPEND: tl.constexpr,
):  # fmt: skip
    """The rows' state after the ring (and this token, APPEND) by the per-step recurrence,
    token by token, stored in the checkpoint's format. ``s`` is the checkpoint tile as
    stored, ``row_scale`` an int8 row's scale (1.0 for a float state)."""
    if QUANTIZED:
        s = s * row_scale[:, None]
    for k in range(0, n):
        dt_k = tl.load(ring_dt_ptrs + k)
        x_k = tl.load(ring_x_ptrs + k * rx_pos, mask=live, other=0.0).to(tl.float32)
        B_k = tl.load(ring_B_ptrs + k * rB_pos, mask=col_ok, other=0.0).to(tl.float32)
        s = s * tl.exp(A * dt_k) + (dt_k * x_k)[:, None] * B_k[None, :]
    if APPEND:
        s = s * tl.exp(A * now_dt) + (now_dt * now_x)[:, None] * now_B[None, :]
    store_state_tile(state_ptrs, scale_ptrs, s, tile_ok, live, QUANTIZED)


@triton.jit
def _deferred_state_update_kernel(
    state_ptr, scale_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, ring_len_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dt_bias_ptr, z_ptr, out_ptr, slots_ptr,
    null_slot, d_state, heads_per_group,
    s_slot, s_head, s_dim, sc_slot, sc_head, rx_slot, rx_head, rx_pos, rdt_slot, rdt_head,
    rB_slot, rB_group, rB_pos, rl_slot,
    x_b, x_h, dt_b, dt_h, B_b, B_g, C_b, C_g, z_b, z_h, o_b, o_h,
    HEAD_DIM: tl.constexpr, RING: tl.constexpr, QUANTIZED: tl.constexpr, HAS_Z: tl.constexpr,
    APPEND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    h = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    g = h // heads_per_group
    slot = tl.load(slots_ptr + b)
    ks = tl.arange(0, RING)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < d_state
    rows = tl.arange(0, BLOCK_M)
    # Per-element copies of the slot test (a scalar mask breaks the Triton interpreter).
    live_slot = (rows * 0 + slot) != null_slot
    live_k = (ks * 0 + slot) != null_slot
    state_head = state_ptr + slot * s_slot + h * s_head
    scale_head = scale_ptr + slot * sc_slot + h * sc_head
    ring_dt_ptrs = ring_dt_ptr + slot * rdt_slot + h * rdt_head
    ring_B_ptrs = ring_B_ptr + slot * rB_slot + g * rB_group + cols
    ring_x_head = ring_x_ptr + slot * rx_slot + h * rx_head
    if APPEND:  # issued first: the first tile's load waits on the slot alone
        first_tile = _load_rows(
            state_head, scale_head, rows, s_dim, cols, col_ok, live_slot, HEAD_DIM, QUANTIZED
        )
    # The head's ring length, read as RING copies of one address (masked per element), and
    # the ring's dt and B beside it, entries past the length zeroed once it is known (x is
    # read per tile, up to the length).
    len_ptrs = ring_len_ptr + slot * rl_slot + h + ks * 0
    n = tl.load(len_ptrs, mask=live_k, other=0)
    dts = tl.load(ring_dt_ptrs + ks, mask=live_k, other=0.0)
    A = tl.load(A_ptr + h)
    now_dt = 0.0
    now_B = tl.zeros([BLOCK_N], dtype=tl.float32)
    if APPEND:
        Bk = tl.load(
            ring_B_ptrs[None, :] + ks[:, None] * rB_pos,
            mask=live_k[:, None] & col_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        now_B = tl.load(B_ptr + b * B_b + g * B_g + cols, mask=col_ok, other=0.0).to(tl.float32)
        Cv = tl.load(C_ptr + b * C_b + g * C_g + cols, mask=col_ok, other=0.0).to(tl.float32)
        now_dt = softplus(
            tl.load(dt_ptr + b * dt_b + h * dt_h).to(tl.float32) + tl.load(dt_bias_ptr + h)
        )
        D = tl.load(D_ptr + h)
    n = tl.max(n, axis=0)
    n = tl.minimum(tl.maximum(n, 0), RING - 1)  # a corrupt length never reads outside
    in_ring = live_k & (ks < n)
    dts = tl.where(in_ring, dts, 0.0)
    if APPEND:  # the token joins the ring unless it fills it: then the ring is written back
        keep_k = live_k & (ks == n) & ((ks * 0 + n) < RING - 1)
        write_back = n == RING - 1
    else:
        keep_k = ks < 0
        write_back = n > 0
        # an empty ring: its state is already whole, nothing is read or written
        live_slot = live_slot & ((rows * 0 + n) > 0)
        first_tile = _load_rows(
            state_head, scale_head, rows, s_dim, cols, col_ok, live_slot, HEAD_DIM, QUANTIZED
        )

    if APPEND:
        # y = exp(A sum dt) (checkpoint . C) + sum_k w_k (B_k . C) x_k + this token's terms,
        # w_k = dt_k exp(A x the later tokens' dt). Entries past the length may hold
        # anything (NaN too): their dt and B . C are zeroed (not multiplied by zero) and
        # their x is not read.
        after = tl.cumsum(dts, axis=0, reverse=True) - dts + now_dt
        bc = tl.where(in_ring, tl.sum(Bk * Cv[None, :], axis=1), 0.0)
        coef = dts * tl.exp(A * after) * bc
        decay = tl.exp(A * (tl.sum(dts, axis=0) + now_dt))
        now_coef = now_dt * tl.sum(now_B * Cv, axis=0) + D
        # The head's dt joins the ring here; B by the group's first head (the others read
        # an entry only from the next step on).
        tl.store(ring_dt_ptrs + ks, now_dt + ks * 0.0, mask=keep_k)
        B_mask = (keep_k & ((ks * 0 + h % heads_per_group) == 0))[:, None] & col_ok[None, :]
        B_ptrs = ring_B_ptrs[None, :] + ks[:, None] * rB_pos
        B_new = now_B[None, :] + tl.zeros([RING, BLOCK_N], dtype=tl.float32)
        tl.store(B_ptrs, B_new.to(ring_B_ptr.dtype.element_ty), mask=B_mask)
        kept = (rows * 0 + tl.sum(keep_k.to(tl.int32), axis=0)) != 0

    for first in tl.static_range(0, HEAD_DIM, BLOCK_M):
        if first == 0:
            s0, row_scale, live, tile_ok, state_ptrs, scale_ptrs = first_tile
        else:
            s0, row_scale, live, tile_ok, state_ptrs, scale_ptrs = _load_rows(
                state_head, scale_head, first + rows, s_dim, cols, col_ok, live_slot, HEAD_DIM,
                QUANTIZED,
            )  # fmt: skip
        p = first + rows
        ring_x_ptrs = ring_x_head + p
        now_x = tl.zeros([BLOCK_M], dtype=tl.float32)
        if APPEND:
            x_in = tl.load(x_ptr + b * x_b + h * x_h + p, mask=live, other=0.0)
            now_x = x_in.to(tl.float32)
            x_mask = in_ring[:, None] & live[None, :]
            xk = tl.load(ring_x_ptrs[None, :] + ks[:, None] * rx_pos, mask=x_mask, other=0.0)
            y = decay * row_scale * tl.sum(s0.to(tl.float32) * Cv[None, :], axis=1)
            y += tl.sum(coef[:, None] * xk.to(tl.float32), axis=0) + now_coef * now_x
            if HAS_Z:
                z = tl.load(z_ptr + b * z_b + h * z_h + p, mask=live, other=0.0).to(tl.float32)
                y = y * z * tl.sigmoid(z)
            y = tl.where(live, y, 0.0)
            # a null slot's rows are written as zeros; rows past the head are not written
            out_ptrs = out_ptr + b * o_b + h * o_h + p
            tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=p < HEAD_DIM)
            x_new = x_in.to(ring_x_ptr.dtype.element_ty)
            tl.store(ring_x_ptrs + n * rx_pos, x_new, mask=live & kept)
        if write_back:
            _write_back(
                state_ptrs, scale_ptrs, s0.to(tl.float32), row_scale, n, A, ring_dt_ptrs,
                ring_x_ptrs, rx_pos, ring_B_ptrs, rB_pos, now_dt, now_x, now_B, col_ok, tile_ok,
                live, QUANTIZED, APPEND,
            )  # fmt: skip
    new_len = tl.sum(tl.where(keep_k, n + 1, 0), axis=0)  # the lane at n: n + 1 if kept
    tl.store(len_ptrs, new_len + ks * 0, mask=live_k & (ks == 0))


def launch(
    state: DeferredState, step: StateUpdateStep | RingFlush, block_m: int, num_warps: int
) -> None:
    """Launches the kernel over ``step.state_slots`` (one per row of x); no argument checks
    (the interface and the decode plan check). A ``RingFlush`` only writes its slots' rings
    back (A is then the only parameter read)."""
    cp = state.checkpoint
    _, nheads, head_dim, d_state = cp.shape
    append = isinstance(step, StateUpdateStep)
    slots = step.state_slots
    batch = step.x.shape[0] if append else slots.shape[0]
    if batch == 0:
        return
    scale = state.checkpoint_scale if state.checkpoint_scale is not None else state.ring_dt
    if append:
        x, dt, B, C, out = step.x, step.dt, step.B, step.C, step.out
        D, dt_bias = step.D, step.dt_bias
        z = step.z if step.z is not None else x
    else:  # unused pointers point at tensors of the right rank
        x = z = out = state.ring_x[:batch, :, 0]
        dt = state.ring_dt[:batch, :, 0]
        B = C = state.ring_B[:batch, :, 0]
        D = dt_bias = step.A
    _deferred_state_update_kernel[(nheads, batch)](
        cp, scale, state.ring_x, state.ring_dt, state.ring_B, state.ring_len,
        x, dt, step.A, B, C, D, dt_bias, z, out, slots,
        step.null_slot, d_state, nheads // state.ring_B.shape[1],
        *cp.stride()[:3], *scale.stride()[:2], *state.ring_x.stride()[:3],
        *state.ring_dt.stride()[:2], *state.ring_B.stride()[:3], state.ring_len.stride(0),
        *x.stride()[:2], *dt.stride(), *B.stride()[:2], *C.stride()[:2], *z.stride()[:2],
        *out.stride()[:2],
        HEAD_DIM=head_dim, RING=state.ring_size, QUANTIZED=state.checkpoint_scale is not None,
        HAS_Z=append and step.z is not None, APPEND=append, BLOCK_M=block_m,
        BLOCK_N=triton.next_power_of_2(d_state), num_warps=num_warps,
    )  # fmt: skip
