"""What the int8 state format's memory traffic costs without its arithmetic, on the GPU.

A probe kernel moves exactly the bytes of one int8 state update (each (head, row)'s 128
int8 values read and written back, its fp32 scale read and written in the separate scale
tensor, and x, z, dt, B, C read and y written per row) with the shipped kernel's tiling
(programs of 16 rows of one sequence and head, one warp), and computes nothing but a sum
that keeps the loads alive. Its time is the floor of an int8 update that moves these bytes
in this layout (the same probe in programs of 1-4 tiles of 16 rows on 1-2 warps ran no
faster: results/experiment-int8-ssu-variants-h100.json): where it sits above a target, no
arithmetic can bring the update below it. The probe runs also without the scale tensor's
accesses and without the activations (the rows' x, z, y), to show which part of the traffic
holds it above a plain copy of the same bytes. Every column counts all of the update's bytes
(``selective_state_update.nbytes``) against the copy roofline, so a probe that skips a part
can exceed 100 %. One more variant keeps each tile's scales right after its rows in one
allocation (a layout the format does not have): what moving the scales into the state's
rows could give.

    python benchmarks/kernels/int8_state_floor.py [--models M,..] [--batches 32,128]

Writes benchmarks/results/kernels-int8_state_floor-<gpu>.json (+ .png): ``ours_us`` is the
shipped int8 update (the device's launch table), ``probe_*_us`` the probe's variants.
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch
import triton
import triton.language as tl
from selective_state_update import inputs, nbytes, ours

from vllm_nemotron_h.testing.op_inputs import MambaShape

PROBE_ROWS = 16  # rows of a program, as the shipped kernel's 16 x 1 and 16 x 2 tiles


@triton.jit
def _probe_kernel(
    state_ptr, scale_ptr, slots_ptr, x_ptr, z_ptr, out_ptr, B_ptr, C_ptr, dt_ptr,
    null_slot, d_state, heads_per_group,
    s_slot, s_head, s_dim, sc_slot, sc_head, x_b, x_h, z_b, z_h, o_b, o_h, B_b, B_g, C_b,
    C_g, dt_b,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SCALES: tl.constexpr, ACTIVATIONS: tl.constexpr, SCALES_IN_TILE: tl.constexpr,
):  # fmt: skip
    first_row = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    h = first_row // HEAD_DIM
    g = h // heads_per_group
    p = first_row % HEAD_DIM + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    slot = tl.load(slots_ptr + b)
    live = (p * 0 + slot) != null_slot
    tile_ok = live[:, None] & (cols < d_state)[None, :]
    if SCALES_IN_TILE:  # a layout the format does not have: each tile's scales after its rows
        rows = tl.arange(0, BLOCK_M)
        tile_base = state_ptr + slot * s_slot + (first_row // BLOCK_M) * (BLOCK_M * (BLOCK_N + 4))
        tile = tile_base + rows[:, None] * BLOCK_N + cols[None, :]
        scales = (tile_base + BLOCK_M * BLOCK_N).to(tl.pointer_type(tl.float32)) + rows
    else:
        tile = state_ptr + slot * s_slot + h * s_head + p[:, None] * s_dim + cols[None, :]
        scales = scale_ptr + slot * sc_slot + h * sc_head + p
    # Every load before any store, as the shipped kernel issues them: the compiler keeps a
    # load after a store to another tensor (they may alias), and the store waits for its data.
    q = tl.load(tile, mask=tile_ok, other=0)
    if SCALES:
        row_scale = tl.load(scales, mask=live, other=0.0)
    if ACTIVATIONS:
        col_ok = cols < d_state
        bc = tl.load(B_ptr + b * B_b + g * B_g + cols, mask=col_ok, other=0.0).to(
            tl.float32
        ) + tl.load(C_ptr + b * C_b + g * C_g + cols, mask=col_ok, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * dt_b + h).to(tl.float32)
        x = tl.load(x_ptr + b * x_b + h * x_h + p).to(tl.float32)
        z = tl.load(z_ptr + b * z_b + h * z_h + p).to(tl.float32)
    tl.store(tile, q, mask=tile_ok)
    if SCALES:
        tl.store(scales, row_scale, mask=live)
    if ACTIVATIONS:
        y = x + z + dt + tl.sum(bc, axis=0)
        tl.store(out_ptr + b * o_b + h * o_h + p, y.to(out_ptr.dtype.element_ty))


def probe(
    t: dict, scales: bool, activations: bool, scales_in_tile: bool = False
) -> Callable[[], object]:
    """The probe's launch over an int8 update's inputs (``inputs(..., torch.int8)``); the
    activations' last dimension is contiguous in the engine's layout, as the probe assumes.
    ``scales_in_tile``: the state and scales in one allocation instead, each tile of
    PROBE_ROWS rows (d_state a power of two) followed by its rows' fp32 scales."""
    state, scale, x, z, out, B, C, dt = (
        t["state"], t["state_scale"], t["x"], t["z"], t["out"], t["B"], t["C"], t["dt"]
    )  # fmt: skip
    batch, nheads, head_dim = x.shape
    d_state = state.shape[-1]
    if scales_in_tile:
        tiles = nheads * head_dim // PROBE_ROWS
        state = torch.zeros(
            state.shape[0], tiles, PROBE_ROWS * (d_state + 4), dtype=torch.int8, device=x.device
        )
    grid = (nheads * head_dim // PROBE_ROWS, batch)
    return lambda: _probe_kernel[grid](
        state, scale, t["state_slots"], x, z, out, B, C, dt,
        0, d_state, nheads // B.shape[1],
        *state.stride()[:3], *scale.stride()[:2], *x.stride()[:2], *z.stride()[:2],
        *out.stride()[:2], *B.stride()[:2], C.stride(0), C.stride(1), dt.stride(0),
        HEAD_DIM=head_dim, BLOCK_M=PROBE_ROWS, BLOCK_N=triton.next_power_of_2(d_state),
        SCALES=scales, ACTIVATIONS=activations, SCALES_IN_TILE=scales_in_tile, num_warps=1,
    )  # fmt: skip


VARIANTS = {  # (scales, activations, scales in the tile)
    "probe_us": (True, True, False),
    "probe_no_scales_us": (False, True, False),
    "probe_no_activations_us": (True, False, False),
    "probe_state_only_us": (False, False, False),
    "probe_scales_in_tile_us": (True, True, True),
}


def compare(bench: harness.Comparison, model: str, state_dtypes: list, batches: list) -> None:
    shape = MambaShape.of_model(model)
    int8 = torch.int8
    for batch in batches:
        nb = nbytes(shape, batch, int8, True)
        extra = {}
        for name, variant in VARIANTS.items():
            us = harness.time_rotating(lambda: probe(inputs(shape, batch, int8), *variant), nb)
            extra[name] = round(us, 3)
            extra[name.replace("_us", "_roofline")] = bench.roofline_share(nb, us)
        shipped = harness.time_rotating(lambda: ours(inputs(shape, batch, int8)), nb)
        bench.record("int8_state_floor", model, "int8", batch, shipped, None, nb, nb, **extra)


if __name__ == "__main__":
    ap = harness.parser(__doc__, ("int8",))
    ap.set_defaults(batches="32,128")
    harness.run([compare], "kernels-int8_state_floor", ap.parse_args())
