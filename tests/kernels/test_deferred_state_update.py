import dataclasses

import pytest
import torch
from helpers import DEVICES, TOL, assert_int8_state_close, draw, poisoned, rel_err, step_of

from vllm_nemotron_h.ops.deferred_state_update import (
    DeferredState,
    deferred_state_update,
    flush_deferred_state,
)
from vllm_nemotron_h.ops.deferred_state_update.cpu import deferred_state_update_cpu
from vllm_nemotron_h.ops.deferred_state_update.layout import RingFlush
from vllm_nemotron_h.ops.deferred_state_update.reference import (
    deferred_state_update_reference,
    flush_deferred_state_reference,
)
from vllm_nemotron_h.ops.selective_state_update.reference import (
    selective_state_update_reference,
)
from vllm_nemotron_h.ops.state_format import dequantize
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape

# (nheads, head_dim, d_state, ngroups): small shapes for the interpreter, real ones on a GPU.
CPU_SHAPES = [(4, 80, 16, 2), (2, 32, 64, 1)]
GPU_SHAPES = [(128, 64, 128, 8), (128, 80, 128, 8)]
FORMATS = [torch.float32, torch.bfloat16, torch.float16, torch.int8]


def on(device):
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    return shapes, act


def copy_state(state: DeferredState, device="cpu") -> DeferredState:
    return DeferredState(
        *(None if t is None else t.clone().to(device) for t in dataclasses.astuple(state))
    )


def values(state: DeferredState) -> torch.Tensor:
    """The checkpoint's values in fp64."""
    cp = state.checkpoint
    if state.checkpoint_scale is None:
        return cp.double()
    return dequantize(cp, state.checkpoint_scale.double())


def assert_checkpoints_close(got: DeferredState, want: DeferredState, tol: float) -> None:
    want = copy_state(want, got.checkpoint.device)
    if got.checkpoint_scale is None:
        assert rel_err(got.checkpoint, want.checkpoint) < tol
    else:
        assert_int8_state_close(
            got.checkpoint, got.checkpoint_scale, want.checkpoint, want.checkpoint_scale
        )


def step_inputs(device, shape, batch, sdt, act, ring, gate=True):
    return LayerCase(draw(device), MambaShape(*shape), batch, sdt, act).deferred(ring, gate)


def next_token(device, shape, batch, act, like: dict) -> dict:
    """A fresh token (x, dt, B, C, z) for the same slots and parameters."""
    t = LayerCase(draw(device), MambaShape(*shape), batch, torch.float32, act).ssu()
    return {**like, **{k: t[k] for k in ("x", "dt", "B", "C", "z")}}


def tolerance(sdt, act, device):
    # The interpreter rounds fp32 -> bf16 by truncation (helpers.INTERPRETER_BF16_TOL); a
    # bf16 checkpoint written back there may sit one step from the reference's.
    if device == "cpu" and sdt == torch.bfloat16:
        return 5e-2
    return max(TOL[act], TOL[sdt])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", FORMATS)
def test_every_ring_position_matches_reference(device, state_dtype):
    """Steps through a whole ring and past it, the slots at random ring lengths (every
    position and the write-back): each step from the kernel's own state, against the
    reference on a copy of it."""
    shapes, act = on(device)
    ring = 4 if device == "cpu" else 16
    for shape in shapes:
        t = step_inputs(device, shape, 3, state_dtype, act, ring)
        steps = ring + 4 if device == "cuda" else 2 * ring + 1
        for _ in range(steps):
            t = next_token(device, shape, 3, act, t)
            want = copy_state(t["state"])
            ref = deferred_state_update_reference(want, step_of(t))
            before = copy_state(t["state"], device)
            out = poisoned(t["x"])
            deferred_state_update(t["state"], step_of(t, out=out))
            tol = tolerance(state_dtype, act, device)
            assert rel_err(out, ref) < tol
            assert (out[0] == 0).all(), "the null-slot row must be zero"
            assert torch.equal(t["state"].ring_len.cpu(), want.ring_len)
            assert_checkpoints_close(t["state"], want, tol)
            live = t["state_slots"][t["state_slots"] != 0]
            untouched = torch.ones(t["state"].checkpoint.shape[0], dtype=torch.bool)
            untouched[live.cpu()] = False
            for name, got, old in zip(
                DeferredState.__dataclass_fields__,
                dataclasses.astuple(t["state"]),
                dataclasses.astuple(before),
            ):
                if got is not None:
                    assert torch.equal(got[untouched], old[untouched]), f"{name}: a foreign slot"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_m", [4, 16, 32, 64, 128])
def test_every_tile_size(device, block_m):
    """A program walks its head in tiles of BLOCK_M rows (head_dim 80: five of 16, or three
    of 32 with the last one half masked): one step at random ring lengths, the rows that
    write back included, against the reference."""
    shapes, act = on(device)
    for shape in shapes:
        if block_m > 1 << (shape[1] - 1).bit_length():  # beyond the head's rows
            continue
        t = step_inputs(device, shape, 3, torch.float32, act, 4)
        want = copy_state(t["state"])
        ref = deferred_state_update_reference(want, step_of(t))
        out = deferred_state_update(t["state"], step_of(t), config=(block_m, 4))
        assert rel_err(out, ref) < TOL[act]
        assert torch.equal(t["state"].ring_len.cpu(), want.ring_len)
        assert_checkpoints_close(t["state"], want, TOL[act])


@pytest.mark.parametrize("block_m", [0, 24, 256])
def test_tile_not_a_power_of_two_up_to_head_dim_raises(block_m):
    t = step_inputs("cpu", (4, 80, 16, 2), 2, torch.float32, torch.float32, 4)
    with pytest.raises(ValueError, match=f"BLOCK_M={block_m} must be a power of two up to 128"):
        deferred_state_update(t["state"], step_of(t), config=(block_m, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_equals_per_step_update_over_64_steps(device):
    """With an fp32 checkpoint the deferred outputs and, after a flush, the state are the
    per-step update's within fp32 accumulation error."""
    # One narrow shape in the interpreter (64 launches), the real ones on a GPU.
    shapes = [(2, 32, 16, 1)] if device == "cpu" else GPU_SHAPES
    for shape in shapes:
        ring = 8 if device == "cpu" else 16
        t = step_inputs(device, shape, 3, torch.float32, torch.float32, ring)
        t["state"].ring_len.zero_()
        plain = t["state"].checkpoint.clone()
        for _ in range(64):
            t = next_token(device, shape, 3, torch.float32, t)
            y = deferred_state_update(t["state"], step_of(t))
            y_step = selective_state_update_reference(plain, step_of(t))
            assert rel_err(y, y_step) < 2e-5
        flush_deferred_state(t["state"], t["A"], t["state_slots"], null_slot=0)
        assert (t["state"].ring_len == 0).all()
        assert rel_err(t["state"].checkpoint, plain) < 2e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", FORMATS)
def test_flush_matches_reference(device, state_dtype):
    shapes, act = on(device)
    for shape in shapes:
        t = step_inputs(device, shape, 4, state_dtype, act, 8)
        want = copy_state(t["state"])
        flush_deferred_state_reference(want, RingFlush(t["A"].cpu(), t["state_slots"].cpu(), 0))
        flush_deferred_state(t["state"], t["A"], t["state_slots"], null_slot=0)
        assert_checkpoints_close(t["state"], want, tolerance(state_dtype, act, device))
        assert torch.equal(t["state"].ring_len.cpu(), want.ring_len)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.int8])
def test_flush_of_empty_rings_reads_and_writes_no_state(device, state_dtype):
    """The engine flushes every slot before a fused per-step decode step: slots whose rings
    are empty keep their state exactly as stored (an int8 row whose largest value is not
    +-127, which a write would re-quantize, included)."""
    shapes, act = on(device)
    for shape in shapes:
        t = step_inputs(device, shape, 4, state_dtype, act, 8)
        state = t["state"]
        state.ring_len.zero_()
        if state_dtype == torch.int8:
            state.checkpoint.copy_(state.checkpoint // 2)
        before = copy_state(state)
        flush_deferred_state(state, t["A"], t["state_slots"], null_slot=0)
        assert torch.equal(state.checkpoint.cpu(), before.checkpoint)
        if state_dtype == torch.int8:
            assert torch.equal(state.checkpoint_scale.cpu(), before.checkpoint_scale)


@pytest.mark.parametrize("state_dtype", FORMATS)
def test_cpu_path_matches_reference(state_dtype):
    """The CPU serving path (vectorised PyTorch) against the literal reference, 2 rings."""
    for shape in CPU_SHAPES:
        t = step_inputs("cpu", shape, 5, state_dtype, torch.float32, 4)
        for _ in range(9):
            t = next_token("cpu", shape, 5, torch.float32, t)
            want = copy_state(t["state"])
            ref = deferred_state_update_reference(want, step_of(t))
            out = poisoned(t["x"])
            deferred_state_update_cpu(t["state"], step_of(t, out=out))
            assert rel_err(out, ref) < TOL[torch.float32] and (out[0] == 0).all()
            assert torch.equal(t["state"].ring_len, want.ring_len)
            assert_checkpoints_close(t["state"], want, TOL[state_dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_corrupt_lengths_stay_in_their_slot(device):
    """A NaN in one sequence's input reaches only its own slot; a ring length outside
    [0, L) is read as the nearest valid one (no read or write outside the ring)."""
    shapes, act = on(device)
    t = step_inputs(device, shapes[0], 4, torch.int8, act, 8)
    slots = t["state_slots"]
    t["x"][3, 1, 3] = float("nan")
    t["state"].ring_len[slots[1]] = 1000
    t["state"].ring_len[slots[2]] = -5
    want = copy_state(t["state"])
    ref = deferred_state_update_reference(want, step_of(t))
    out = deferred_state_update(t["state"], step_of(t))
    ok = torch.ones(4, dtype=torch.bool)
    ok[3] = False
    assert rel_err(out[ok], ref[ok.cpu()].to(out.device)) < TOL[act]
    assert torch.isfinite(out[1:3]).all()
    assert torch.equal(t["state"].ring_len.cpu(), want.ring_len)
    others = [s for s in slots.tolist() if s != int(slots[3])]
    assert torch.isfinite(values(t["state"])[others]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.int8])
def test_ring_entries_past_the_length_never_reach_results(device, state_dtype):
    """The kernel loads a ring's dt and B before it knows the ring's length: entries past it
    (NaN here, as a fresh cache may hold) must not reach the output, the checkpoint written
    back or the ring."""
    shapes, act = on(device)
    t = step_inputs(device, shapes[0], 4, state_dtype, act, 8)
    state = t["state"]
    pos = torch.arange(state.ring_size, device=state.ring_len.device)
    state.ring_len[t["state_slots"][1]] = state.ring_size - 1  # this slot writes back
    past = pos[None, None, :] >= state.ring_len[:, :, None]
    state.ring_dt[past] = float("nan")
    state.ring_x[past] = float("nan")
    state.ring_B[past[:, : state.ring_B.shape[1]]] = float("nan")  # lengths equal per slot
    want = copy_state(state)
    ref = deferred_state_update_reference(want, step_of(t))
    out = deferred_state_update(state, step_of(t))
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < tolerance(state_dtype, act, device)
    assert torch.equal(state.ring_len.cpu(), want.ring_len)
    assert torch.isfinite(values(state)).all()
    assert_checkpoints_close(state, want, tolerance(state_dtype, act, device))
    kept = pos[None, None, :] < state.ring_len[:, :, None]
    assert torch.isfinite(state.ring_x[kept]).all() and torch.isfinite(state.ring_dt[kept]).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(ring_dt=torch.zeros(8, 4, 3)), "ring size"),
        (dict(ring_len=torch.zeros(8, 4, dtype=torch.int64)), "ring_len must have dtype"),
        (dict(ring_len=torch.zeros(8, 4, 2, dtype=torch.int32)), "ring_len must have shape"),
        (dict(ring_B=torch.zeros(8, 3, 8, 16)), "ngroups dividing nheads"),
        (dict(ring_x=torch.zeros(8, 4, 4, 32)), "ring_x must have shape"),
        (dict(checkpoint_scale=torch.zeros(8, 4, 32)), "only"),
    ],
)
def test_bad_arguments_raise(change, message):
    t = step_inputs("cpu", (4, 32, 16, 2), 5, torch.float32, torch.float32, 8)
    t["state"] = dataclasses.replace(t["state"], **change)
    with pytest.raises(ValueError, match=message):
        deferred_state_update(t["state"], step_of(t))
