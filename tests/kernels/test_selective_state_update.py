import pytest
import torch
from helpers import DEVICES, TOL, draw, poisoned, rel_err

from vllm_nemotron_h.ops import selective_state_update
from vllm_nemotron_h.ops.selective_state_update.cpu import selective_state_update_cpu
from vllm_nemotron_h.ops.selective_state_update.reference import (
    selective_state_update_reference,
)
from vllm_nemotron_h.testing.op_inputs import MambaShape, ssu_inputs

# (nheads, head_dim, d_state, ngroups): small shapes for the interpreter, real ones on a GPU.
CPU_SHAPES = [(4, 80, 16, 2), (2, 32, 256, 1), (4, 64, 64, 4)]
GPU_SHAPES = [(128, 64, 128, 8), (128, 80, 128, 8), (64, 64, 128, 8), (8, 128, 256, 1)]


def make_inputs(device, batch, shape, state_dtype, act, gate, strided):
    return ssu_inputs(
        draw(device), MambaShape(*shape), batch, state_dtype, act, gate=gate, strided=strided
    )


def check(device, shape, batch, state_dtype, act, gate, noncontig, config=None):
    t = make_inputs(device, batch, shape, state_dtype, act, gate, noncontig)
    s_ref = t["state"].clone()
    ref = selective_state_update_reference(**{**t, "state": s_ref}, null_slot=0)
    out = poisoned(ref)
    before = t["state"].clone()
    selective_state_update(**t, null_slot=0, out=out, config=config)
    tol = TOL[act] if state_dtype == torch.float32 else max(TOL[act], TOL[state_dtype])
    assert rel_err(out, ref) < tol
    assert rel_err(t["state"], s_ref) < max(tol, TOL[state_dtype])
    assert (out[0] == 0).all(), "the null-slot row must be zero"
    assert torch.equal(t["state"][0], before[0]), "the null slot's state must stay untouched"
    untouched = torch.ones(t["state"].shape[0], dtype=torch.bool, device=device)
    untouched[t["state_slots"]] = False
    assert torch.equal(t["state"][untouched], before[untouched])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate", [True, False])
def test_matches_reference(device, state_dtype, gate):
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for i, shape in enumerate(shapes):
        for batch in (3,) if device == "cpu" else (1, 7, 64):
            check(device, shape, batch, state_dtype, act, gate, noncontig=bool(i % 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_activation_dtypes(device, act):
    check(device, (4, 80, 16, 2), 2, torch.float32, act, gate=True, noncontig=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_m", [4, 8, 16, 32, 64])
def test_every_tile_size(device, block_m):
    """Tiles that span several heads (head_dim 80 with 32 rows) or a whole group."""
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for nheads, head_dim, d_state, ngroups in shapes:
        if nheads // ngroups * head_dim % block_m == 0:
            shape = (nheads, head_dim, d_state, ngroups)
            check(device, shape, 5, torch.float32, act, True, True, config=(block_m, 2))


def test_tile_spanning_two_groups_raises():
    t = make_inputs("cpu", 2, (4, 80, 16, 2), torch.float32, torch.float32, True, False)
    with pytest.raises(ValueError, match="BLOCK_M=64 must divide"):
        selective_state_update(**t, null_slot=0, config=(64, 1))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(B=torch.zeros(2, 3, 16)), "ngroups"),
        (dict(A=torch.zeros(4, dtype=torch.float64)), "A must have dtype"),
        (dict(state_slots=torch.zeros(2, dtype=torch.int32)), "state_slots"),
        (dict(x=torch.zeros(2, 4, 20)), "head_dim"),
        (dict(dt=torch.zeros(3, 4)), "dt must have shape"),
    ],
)
def test_bad_arguments_raise(change, message):
    t = make_inputs("cpu", 2, (4, 32, 16, 2), torch.float32, torch.float32, True, False)
    if "x" in change:
        t["state"] = torch.zeros(5, 4, 20, 16)
    t.update(change)
    with pytest.raises(ValueError, match=message):
        selective_state_update(**t, null_slot=0)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gate", [True, False])
def test_cpu_path_matches_reference(state_dtype, gate):
    """The CPU serving path (vectorised PyTorch) against the literal reference."""
    for shape in CPU_SHAPES:
        t = make_inputs("cpu", 5, shape, state_dtype, torch.float32, gate, strided=True)
        s_ref = t["state"].clone()
        ref = selective_state_update_reference(**{**t, "state": s_ref}, null_slot=0)
        out = poisoned(ref)
        selective_state_update_cpu(**t, null_slot=0, out=out)
        assert rel_err(out, ref) < TOL[state_dtype] and (out[0] == 0).all()
        assert rel_err(t["state"], s_ref) < TOL[state_dtype]
