import pytest
import torch
from helpers import DEVICES, TOL, assert_int8_state_close, draw, poisoned, rel_err, step_of

from vllm_nemotron_h.ops import selective_state_update
from vllm_nemotron_h.ops.selective_state_update.cpu import selective_state_update_cpu
from vllm_nemotron_h.ops.selective_state_update.reference import (
    selective_state_update_reference,
)
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape

# (nheads, head_dim, d_state, ngroups): small shapes for the interpreter, real ones on a GPU.
CPU_SHAPES = [(4, 80, 16, 2), (2, 32, 256, 1), (4, 64, 64, 4)]
GPU_SHAPES = [(128, 64, 128, 8), (128, 80, 128, 8), (64, 64, 128, 8), (8, 128, 256, 1)]


def make_inputs(device, batch, shape, state_dtype, act, gate, strided):
    case = LayerCase(draw(device), MambaShape(*shape), batch, state_dtype, act)
    return case.ssu(gate, strided)


def check(device, shape, batch, state_dtype, act, gate, noncontig, config=None):
    t = make_inputs(device, batch, shape, state_dtype, act, gate, noncontig)
    s_ref = t["state"].clone()
    ref = selective_state_update_reference(s_ref, step_of(t), t["state_scale"])
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_programs_of_several_tiles(device, state_dtype):
    """Programs that advance several tiles, loading the next while computing one: inside
    one head (int8 takes the head's dt, A and D once) and across heads (head_dim 80)."""
    act = torch.bfloat16 if device == "cuda" else torch.float32
    cases = (
        [((4, 32, 16, 2), (8, 1, 4)), ((4, 80, 16, 2), (16, 2, 5)), ((4, 80, 16, 2), (32, 1, 5))]
        if device == "cpu"
        else [((128, 64, 128, 8), (8, 1, 8)), ((128, 80, 128, 8), (16, 1, 5)),
              ((128, 80, 128, 8), (32, 1, 2)), ((128, 64, 128, 8), (4, 1, 16))]
    )  # fmt: skip
    for shape, config in cases:
        for batch in (3,) if device == "cpu" else (1, 64):
            if state_dtype == torch.int8:
                check_int8(device, *int8_inputs(device, batch, shape, act), config=config)
            else:
                check(device, shape, batch, state_dtype, act, True, True, config=config)


def test_bad_configs_raise():
    t = make_inputs("cpu", 2, (4, 80, 16, 2), torch.float32, torch.float32, True, False)
    for config, message in [
        ((16, 1, 3), "BLOCK_M x TILES = 48 must divide"),
        ((16,), "must be \\(BLOCK_M, num_warps\\[, TILES\\]\\)"),
        ((16, 1, 0), "each >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            selective_state_update(**t, null_slot=0, config=config)


def test_tile_spanning_two_groups_raises():
    t = make_inputs("cpu", 2, (4, 80, 16, 2), torch.float32, torch.float32, True, False)
    with pytest.raises(ValueError, match="BLOCK_M x TILES = 64 must divide"):
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
        ref = selective_state_update_reference(s_ref, step_of(t), t["state_scale"])
        out = poisoned(ref)
        selective_state_update_cpu(t["state"], t["state_scale"], step_of(t, out=out))
        assert rel_err(out, ref) < TOL[state_dtype] and (out[0] == 0).all()
        assert rel_err(t["state"], s_ref) < TOL[state_dtype]


def check_int8(device, t, ref_inputs, config=None):
    """Runs the op on ``t`` and the reference on a copy; compares output and the dequantized
    states (within one quantum of the reference's row: rounding of a value on a boundary may
    go either way between fp32 and fp64), and that no other slot or scale moved."""
    before = {k: t[k].clone() for k in ("state", "state_scale")}
    ref = selective_state_update_reference(
        ref_inputs["state"], step_of(ref_inputs), ref_inputs["state_scale"]
    )
    out = poisoned(ref)
    selective_state_update(**t, null_slot=0, out=out, config=config)
    tol = TOL[t["x"].dtype]
    live = t["state_slots"][t["state_slots"] != 0]
    finite = torch.isfinite(ref).all(-1).all(-1)
    assert rel_err(out[finite], ref[finite]) < tol
    assert (out[t["state_slots"] == 0] == 0).all(), "the null-slot row must be zero"
    assert_int8_state_close(
        t["state"][live], t["state_scale"][live],
        ref_inputs["state"][live], ref_inputs["state_scale"][live],
    )  # fmt: skip
    if live.numel():
        same_q = (t["state"][live] == ref_inputs["state"][live].to(device)).float().mean()
        assert same_q > 0.99, f"only {same_q:.4f} of the int8 values equal the reference's"
    scale_ok = torch.isfinite(ref_inputs["state_scale"][live].to(device))
    got_s, want_s = t["state_scale"][live][scale_ok], ref_inputs["state_scale"][live]
    assert rel_err(got_s, want_s.to(device)[scale_ok]) < 1e-6
    untouched = torch.ones(t["state"].shape[0], dtype=torch.bool, device=device)
    untouched[live] = False
    for k in before:
        assert torch.equal(t[k][untouched], before[k][untouched]), f"{k}: a foreign slot moved"


def int8_inputs(device, batch, shape, act):
    t = make_inputs(device, batch, shape, torch.int8, act, gate=True, strided=True)
    return t, {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_int8_state_matches_reference(device):
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in shapes:
        for batch in (3,) if device == "cpu" else (1, 7, 64):
            check_int8(device, *int8_inputs(device, batch, shape, act))


@pytest.mark.parametrize("device", DEVICES)
def test_int8_rows_of_zeros_tiny_and_huge_values_and_nan(device):
    """A row that stays zero keeps scale 0; rows decayed far below the least old-row scale
    the update divides by (2^-64) come out as the reference's; rows near fp32's top stay
    finite; a NaN in one sequence's input reaches only that sequence's slot."""
    shape = (4, 32, 16, 2) if device == "cpu" else (128, 64, 128, 8)
    act = torch.bfloat16 if device == "cuda" else torch.float32
    t, ref_inputs = int8_inputs(device, 4, shape, act)
    slots = t["state_slots"]
    for inputs in (t, ref_inputs):
        inputs["state"][slots[1], 0] = 0  # zero rows of head 0 ...
        inputs["state_scale"][slots[1], 0] = 0
        inputs["x"][1, 0] = 0  # ... that get no input: they stay zero
        inputs["state_scale"][slots[0]] = 1e-25  # tiny values
        inputs["state_scale"][slots[2]] = 1e30  # huge values, decaying
        inputs["x"][3, 1, 3] = float("nan")  # poisons sequence 3's head 1 only
    check_int8(device, t, ref_inputs)
    assert (t["state_scale"][slots[1], 0] == 0).all() and (t["state"][slots[1], 0] == 0).all()
    assert torch.isfinite(t["state_scale"][slots[2]]).all()


@pytest.mark.parametrize("change, message", [
    (dict(state_scale=None), "state_scale must be a torch.Tensor"),
    (dict(state_scale=torch.zeros(8, 4, 32, 1)), "state_scale must have shape"),
    (dict(state_scale=torch.zeros(8, 4, 32, dtype=torch.float16)), "state_scale must have dtype"),
    (dict(state=torch.zeros(8, 4, 32, 16)), "state_scale is for an int8 state only"),
])  # fmt: skip
def test_int8_bad_arguments_raise(change, message):
    t = make_inputs("cpu", 5, (4, 32, 16, 2), torch.int8, torch.float32, True, False)
    t.update(change)
    with pytest.raises(ValueError, match=message):
        selective_state_update(**t, null_slot=0)


def test_int8_cpu_path_matches_reference():
    for shape in CPU_SHAPES:
        t, ref_inputs = int8_inputs("cpu", 5, shape, torch.float32)
        ref = selective_state_update_reference(
            ref_inputs["state"], step_of(ref_inputs), ref_inputs["state_scale"]
        )
        out = poisoned(ref)
        selective_state_update_cpu(t["state"], t["state_scale"], step_of(t, out=out))
        assert rel_err(out, ref) < TOL[torch.float32]
        # the same formula in fp32 and fp64: a value on a rounding boundary may go either way
        steps = (t["state"].int() - ref_inputs["state"].int()).abs()
        assert steps.max() <= 1 and (steps == 0).float().mean() > 0.99
        assert rel_err(t["state_scale"], ref_inputs["state_scale"]) < 1e-6
