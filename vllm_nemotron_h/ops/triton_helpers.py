"""Triton device functions shared by the ops' kernels (the fused decode tail is made of the
conv update's and the state update's pieces)."""

import triton
import triton.language as tl


@triton.jit
def conv_window(
    x_row_ptr,
    st,
    s_t,
    ch,
    ch_ok,
    st_ok,
    w_ptr,
    w_dim,
    w_t,
    bias_ptr,
    WIDTH: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Loads one token's window of channels ``ch`` (state taps at ``st + k * s_t``, the new
    value at ``x_row_ptr + ch``) and convolves it in fp32, before the activation. Returns
    (conv, w1, w2, xv): the taps the state shift writes (w1, w2 unused below WIDTH 3, 4)."""
    xv = tl.load(x_row_ptr + ch, mask=ch_ok, other=0.0)
    w0 = tl.load(st, mask=st_ok, other=0.0)
    w1 = w0
    w2 = w0
    if WIDTH >= 3:
        w1 = tl.load(st + s_t, mask=st_ok, other=0.0)
    if WIDTH >= 4:
        w2 = tl.load(st + 2 * s_t, mask=st_ok, other=0.0)
    wrow = w_ptr + ch * w_dim
    acc = tl.load(wrow + (WIDTH - 1) * w_t, mask=ch_ok, other=0.0).to(tl.float32) * xv.to(
        tl.float32
    )
    acc += tl.load(wrow, mask=ch_ok, other=0.0).to(tl.float32) * w0.to(tl.float32)
    if WIDTH >= 3:
        acc += tl.load(wrow + w_t, mask=ch_ok, other=0.0).to(tl.float32) * w1.to(tl.float32)
    if WIDTH >= 4:
        acc += tl.load(wrow + 2 * w_t, mask=ch_ok, other=0.0).to(tl.float32) * w2.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
    return acc, w1, w2, xv


@triton.jit
def conv_shift(st, s_t, w1, w2, xv, mask, WIDTH: tl.constexpr):
    """Rolls the window from registers (the taps conv_window returned): no second read."""
    sty = st.dtype.element_ty
    if WIDTH == 2:
        tl.store(st, xv.to(sty), mask=mask)
    if WIDTH == 3:
        tl.store(st, w1, mask=mask)
        tl.store(st + s_t, xv.to(sty), mask=mask)
    if WIDTH == 4:
        tl.store(st, w1, mask=mask)
        tl.store(st + s_t, w2, mask=mask)
        tl.store(st + 2 * s_t, xv.to(sty), mask=mask)


@triton.jit
def plane_tile(slots_ptr, b, first_row, null_slot, d_state, HEAD_DIM, HAS_SLOTS, BLOCK_M, BLOCK_N):
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
def load_state_tile(state_ptrs, scale_ptrs, tile_ok, live, QUANTIZED: tl.constexpr):
    """A tile of the state as stored and its rows' scales (an int8 state, QUANTIZED; 1.0 for
    a float state, whose ``scale_ptrs`` are not read)."""
    s = tl.load(state_ptrs, mask=tile_ok, other=0)
    row_scale = 1.0
    if QUANTIZED:
        row_scale = tl.load(scale_ptrs, mask=live, other=0.0)
    return s, row_scale


@triton.jit
def store_state_tile(state_ptrs, scale_ptrs, s, tile_ok, live, QUANTIZED: tl.constexpr):
    """Stores the fp32 tile ``s`` in the state's format: int8 rows with new scales
    (QUANTIZED) or the float state's dtype. Returns the tile as stored and its rows' scales
    (1.0 for a float state): what load_state_tile would read back."""
    stored = s.to(state_ptrs.dtype.element_ty)
    scale = 1.0
    if QUANTIZED:
        stored, scale = quantize_rows(s)
    tl.store(state_ptrs, stored, mask=tile_ok)
    if QUANTIZED:
        tl.store(scale_ptrs, scale, mask=live)
    return stored, scale


@triton.jit
def softplus(v):
    """log(1 + exp(v)) in fp32, v itself above 20 (where exp would overflow first)."""
    return tl.where(v <= 20.0, tl.log(1.0 + tl.exp(v)), v)


@triton.jit
def state_step(s, row_scale, x, Bv, dt, A):
    """One token of the recurrence for a tile of rows, in fp32: ``s`` (rows, d_state) the old
    state times ``row_scale`` (an int8 state's per-row scales, folded into the decay; 1.0 for
    a float state), ``x``, ``dt`` (dt + dt_bias, before softplus) and ``A`` per row, ``Bv``
    (d_state,). Returns the new state; callers store it before they reduce y = s . C + D x."""
    dt = softplus(dt)
    decay = tl.exp(A * dt) * row_scale
    return s.to(tl.float32) * decay[:, None] + (dt * x)[:, None] * Bv[None, :]


# 2^-64: the least decay x scale the int8 update in the old rows' units divides by; where the
# true one is smaller, the old state's part of a new value is off by at most 127 x 2^-64
# (~7e-18), where the row's old values have all but decayed away.
MIN_OLD_ROW_SCALE = tl.constexpr(5.421010862427522e-20)


@triton.jit
def reciprocal(v, INLINE_PTX: tl.constexpr):
    """1 / v for a normal fp32 v (or inf, or NaN). INLINE_PTX (GPU only: the interpreter runs
    no PTX): rcp.approx.ftz, one instruction within an ulp, where Triton's division adds a
    range check and two scalings; the int8 update is bound by instruction issue."""
    if INLINE_PTX:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / v


@triton.jit
def quantized_state_step(q, row_scale, x, Bv, dt, A, INLINE_PTX: tl.constexpr):
    """state_step for an int8 tile, in the old rows' units: with f = decay * row_scale per row
    (at least MIN_OLD_ROW_SCALE), the new values are f * u, u = q + B * (dt x / f), one FMA an
    element where the direct form converts, scales and adds. The int8 update is bound by
    instruction issue, not by its bytes (benchmarks/NOTES.md). Returns (u, f)."""
    dt = softplus(dt)
    f = tl.maximum(tl.exp(A * dt) * row_scale, MIN_OLD_ROW_SCALE)
    return q.to(tl.float32) + (dt * x * reciprocal(f, INLINE_PTX))[:, None] * Bv[None, :], f


@triton.jit
def store_quantized_step(state_ptrs, scale_ptrs, u, f, tile_ok, live, INLINE_PTX: tl.constexpr):
    """Stores rows f * u (quantized_state_step's) in the int8 format of quantize_rows: scale
    f * max|u| / 127, q = u * 127 / max|u| rounded to nearest (f cancels). INLINE_PTX (GPU
    only): one FMA rounds, 1.5 * 2^23 + u * inv (0f4B400000; its ulp is 1, so the sum's low
    bits hold the rounded value in two's complement) where floor(v + 1/2) takes an FMA, a
    floor and a conversion; ties go to even there, up in the references (state_format)."""
    amax = tl.max(tl.abs(u), axis=1)
    # a kept row's max is at least 1 in these units (its largest old q), or the new part
    # alone above MIN_ROW_MAX / MIN_OLD_ROW_SCALE: never subnormal, as rcp.approx.ftz needs
    kept = f * amax > 1e-30  # state_format.MIN_ROW_MAX
    inv = tl.where(kept, 127.0 * reciprocal(amax, INLINE_PTX), 0.0)
    if INLINE_PTX:
        bits = tl.inline_asm_elementwise(
            "fma.rn.f32 $0, $1, $2, 0f4B400000;",
            "=r,r,r",
            [u, inv[:, None]],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
        q = bits.to(tl.int32, bitcast=True).to(tl.int8)
    else:
        q = tl.floor(u * inv[:, None] + 0.5).to(tl.int8)
    tl.store(state_ptrs, q, mask=tile_ok)
    tl.store(scale_ptrs, tl.where(kept, f * amax / 127.0, 0.0), mask=live)


@triton.jit
def quantize_rows(s):
    """The int8 state format (ops/state_format.py) of a tile of fp32 rows ``s`` (rows,
    d_state): (q int8, scale fp32 per row). Masked columns must hold 0. No clamp: with
    inv = 127 / max |row| (finite, the row's max above MIN_ROW_MAX), |s * inv| <= 127 up to
    rounding, which floor(v + 1/2) keeps within +-127."""
    amax = tl.max(tl.abs(s), axis=1)
    kept = amax > 1e-30  # state_format.MIN_ROW_MAX
    scale = tl.where(kept, amax / 127.0, 0.0)
    inv = tl.where(kept, 127.0 / amax, 0.0)
    q = tl.floor(s * inv[:, None] + 0.5)
    return q.to(tl.int8), scale
