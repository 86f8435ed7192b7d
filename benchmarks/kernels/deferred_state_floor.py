"""What the deferred state update's memory traffic costs without its arithmetic, on the GPU.

A probe kernel moves the bytes of one step of the deferred update (ops/deferred_state_update:
a checkpoint in the state format, a ring of L tokens per slot) with the shipped kernel's grid
(one program per head of a sequence, its rows in tiles): each program reads its head's ring
length n, its checkpoint rows (and an int8 checkpoint's scales), the ring's x of entries
0..n-1, the ring's dt and its group's ring B, and the token's x, z, dt, B and C; writes the
token into the ring (x, dt, B, the length) and y; and at the step that fills the ring (n =
L - 1) writes its checkpoint rows back (and their scales) instead. It computes nothing but
sums that keep the loads alive. The ring lengths cycle as the replayed calls advance them
(each slot starts at a random length, as in ``deferred_state_update.py``), so a call's time
is the amortised time of a step. Its time is the floor of a deferred update that moves these
bytes in this layout: where it sits above a target, no arithmetic can bring the update
below it. ``ours_us`` is the shipped deferred update (the device's launch table); every
column counts ``deferred_state_update.nbytes`` against the copy roofline. At the floor's tile
the probe runs again with less of the ring's traffic (``probe_<variant>_us``: the group's ring
B read only up to the ring length, or not at all; no ring x; neither), to show which part of
it holds the floor above a plain copy of the same bytes.

    python benchmarks/kernels/deferred_state_floor.py [--models M,..] [--batches 32,128]
                                                      [--state-dtypes int8,bfloat16,float32]

Writes benchmarks/results/kernels-deferred_state_floor-<gpu>.json (+ .png).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import triton
import triton.language as tl
from deferred_state_update import RING_SIZE, inputs, nbytes, ours

from vllm_nemotron_h.testing.op_inputs import MambaShape

# (rows of a tile, warps) the probe runs with; the floor is the fastest
PROBE_CONFIGS = ((16, 1), (32, 1), (32, 2), (64, 4))
# Which of its group's ring B entries a program reads: all L (the shipped kernel issues that
# load beside the ring length, before it knows how many are in the ring), the ring's n
# entries once n is known, or none.
ALL_ENTRIES, ENTRIES_IN_RING, NO_ENTRIES = 0, 1, 2
# At the floor's tile: the probe with less of the ring's traffic (its bytes still counted),
# to show what part of it holds the floor above a copy of the same bytes.
VARIANTS = {
    "ring_b_in_ring": dict(ring_B=ENTRIES_IN_RING),
    "no_ring_b": dict(ring_B=NO_ENTRIES),
    "no_ring_x": dict(ring_x=False),
    "no_ring_reads": dict(ring_B=NO_ENTRIES, ring_x=False),
}


@triton.jit
def _probe_kernel(
    state_ptr, scale_ptr, ring_x_ptr, ring_dt_ptr, ring_B_ptr, ring_len_ptr,
    x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, out_ptr, slots_ptr, heads_per_group,
    s_slot, s_head, s_dim, sc_slot, sc_head, rx_slot, rx_head, rx_pos, rdt_slot, rdt_head,
    rB_slot, rB_group, rB_pos, rl_slot, x_b, x_h, dt_b, B_b, B_g, C_b, C_g, z_b, z_h, o_b, o_h,
    HEAD_DIM: tl.constexpr, RING: tl.constexpr, QUANTIZED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RING_B: tl.constexpr, RING_X: tl.constexpr,
):  # fmt: skip
    h = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    g = h // heads_per_group
    slot = tl.load(slots_ptr + b)
    ks = tl.arange(0, RING)
    cols = tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    len_ptr = ring_len_ptr + slot * rl_slot + h
    n = tl.load(len_ptr)
    ring_dt = ring_dt_ptr + slot * rdt_slot + h * rdt_head
    ring_B = ring_B_ptr + slot * rB_slot + g * rB_group
    dts = tl.load(ring_dt + ks)
    # RING_B as ALL_ENTRIES (0), ENTRIES_IN_RING (1) or NO_ENTRIES (2) below
    if RING_B == 0:  # as the shipped kernel: issued beside n, every entry
        Bk = tl.load(ring_B + ks[:, None] * rB_pos + cols[None, :]).to(tl.float32)
    elif RING_B == 1:  # after n: the ring's entries alone
        in_ring = (ks < n)[:, None] & (cols < BLOCK_N)[None, :]
        Bk = tl.load(ring_B + ks[:, None] * rB_pos + cols[None, :], mask=in_ring, other=0.0)
        Bk = Bk.to(tl.float32)
    else:
        Bk = tl.zeros([RING, BLOCK_N], dtype=tl.float32)
    now_B = tl.load(B_ptr + b * B_b + g * B_g + cols)
    C = tl.load(C_ptr + b * C_b + g * C_g + cols).to(tl.float32)
    now_dt = tl.load(dt_ptr + b * dt_b + h).to(tl.float32)
    shared = tl.sum(dts, axis=0) + tl.sum(tl.sum(Bk, axis=0) + C, axis=0) + now_dt
    # per-element copies of the scalar tests (a scalar mask breaks the Triton interpreter)
    write_back = (rows * 0 + n) == RING - 1
    keeps = (ks * 0 + n) < RING - 1
    for first in tl.static_range(0, HEAD_DIM, BLOCK_M):
        p = first + rows
        live = p < HEAD_DIM
        tile_ok = live[:, None] & (cols < BLOCK_N)[None, :]
        tile = state_ptr + slot * s_slot + h * s_head + p[:, None] * s_dim + cols[None, :]
        scales = scale_ptr + slot * sc_slot + h * sc_head + p
        s = tl.load(tile, mask=tile_ok, other=0)
        y = tl.sum(s.to(tl.float32), axis=1) + shared
        if QUANTIZED:
            row_scale = tl.load(scales, mask=live, other=0.0)
            y += row_scale
        ring_x = ring_x_ptr + slot * rx_slot + h * rx_head + p
        if RING_X:
            in_ring = (ks < n)[:, None] & live[None, :]
            xk = tl.load(ring_x[None, :] + ks[:, None] * rx_pos, mask=in_ring, other=0.0)
        else:
            xk = tl.zeros([RING, BLOCK_M], dtype=ring_x_ptr.dtype.element_ty)
        x = tl.load(x_ptr + b * x_b + h * x_h + p, mask=live)
        z = tl.load(z_ptr + b * z_b + h * z_h + p, mask=live).to(tl.float32)
        y += tl.sum(xk.to(tl.float32), axis=0) + x.to(tl.float32) + z
        tl.store(out_ptr + b * o_b + h * o_h + p, y.to(out_ptr.dtype.element_ty), mask=live)
        tl.store(ring_x + n * rx_pos, x, mask=live & ~write_back)
        tl.store(tile, s, mask=tile_ok & write_back[:, None])
        if QUANTIZED:
            tl.store(scales, row_scale, mask=live & write_back)
    at_n = (ks == n) & keeps
    tl.store(ring_dt + ks, now_dt + ks * 0.0, mask=at_n)
    first_head = (ks * 0 + h % heads_per_group) == 0
    B_ptrs = ring_B + ks[:, None] * rB_pos + cols[None, :]
    tl.store(
        B_ptrs,
        now_B[None, :] + tl.zeros([RING, BLOCK_N], dtype=now_B.dtype),
        mask=(at_n & first_head)[:, None],
    )
    tl.store(len_ptr + ks * 0, tl.where(keeps, n + 1, 0), mask=ks == 0)


def probe(
    t: dict, block_m: int, num_warps: int, ring_B: int = ALL_ENTRIES, ring_x: bool = True
) -> Callable[[], object]:
    """The probe's launch over a deferred update's inputs (``inputs(...)`` of
    deferred_state_update.py, whose slots are all live); d_state a power of two and the
    activations' last dimension contiguous, as the engine lays them out. ``ring_B``: which of
    the group's ring B entries a program reads (ALL_ENTRIES, ENTRIES_IN_RING or NO_ENTRIES);
    ``ring_x``: whether a tile reads its rows' ring x."""
    s, x, z, out, B, C, dt = t["state"], t["x"], t["z"], t["out"], t["B"], t["C"], t["dt"]
    cp = s.checkpoint
    batch, nheads, head_dim = x.shape
    scale = s.checkpoint_scale if s.checkpoint_scale is not None else s.ring_dt
    return lambda: _probe_kernel[(nheads, batch)](
        cp, scale, s.ring_x, s.ring_dt, s.ring_B, s.ring_len, x, dt, B, C, z, out,
        t["state_slots"], nheads // s.ring_B.shape[1],
        *cp.stride()[:3], *scale.stride()[:2], *s.ring_x.stride()[:3], *s.ring_dt.stride()[:2],
        *s.ring_B.stride()[:3], s.ring_len.stride(0), *x.stride()[:2], dt.stride(0),
        *B.stride()[:2], *C.stride()[:2], *z.stride()[:2], *out.stride()[:2],
        HEAD_DIM=head_dim, RING=s.ring_size, QUANTIZED=s.checkpoint_scale is not None,
        BLOCK_M=block_m, BLOCK_N=cp.shape[-1], RING_B=ring_B, RING_X=ring_x,
        num_warps=num_warps,
    )  # fmt: skip


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    for sdt in state_dtypes:
        for batch in batches:
            nb = int(nbytes(shape, batch, sdt))
            extra = {}
            for block_m, num_warps in PROBE_CONFIGS:
                us = harness.time_rotating(
                    lambda: probe(inputs(shape, batch, sdt), block_m, num_warps), nb
                )
                extra[f"probe_{block_m}x{num_warps}_us"] = round(us, 3)
            floor = min(extra.values())
            best = PROBE_CONFIGS[list(extra.values()).index(floor)]
            extra["probe_us"] = floor
            extra["probe_roofline"] = bench.roofline_share(nb, floor)
            for name, variant in VARIANTS.items():
                us = harness.time_rotating(
                    lambda: probe(inputs(shape, batch, sdt), *best, **variant), nb
                )
                extra[f"probe_{name}_us"] = round(us, 3)
            shipped = harness.time_rotating(lambda: ours(inputs(shape, batch, sdt)), nb)
            bench.record(
                "deferred_state_floor", model, harness.dtype_name(sdt), batch, shipped, None,
                nb, nb, ring=RING_SIZE, **extra,
            )  # fmt: skip


if __name__ == "__main__":
    ap = harness.parser(__doc__, ("int8", "bfloat16", "float32"))
    ap.set_defaults(batches="32,128")
    harness.run([compare], "kernels-deferred_state_floor", ap.parse_args())
