import pytest
import torch
from helpers import DEVICES, GPU, TOL, assert_int8_state_close, poisoned, rel_err

from vllm_nemotron_h.ops import mamba2_prefill_tail
from vllm_nemotron_h.ops.mamba2_prefill_tail import kernel
from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.mamba2_prefill_tail.cpu import mamba2_prefill_tail_cpu
from vllm_nemotron_h.ops.mamba2_prefill_tail.reference import mamba2_prefill_tail_reference
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm

STATE_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8]
NUM_SLOTS = 9
EPS = 1e-5


def shapes(device):
    # (heads, head_dim, d_state, groups): d_state 48 (masked columns) on CPU; real shapes on GPU
    if device == "cpu":
        return [(3, 8, 16, 3), (2, 6, 48, 1)]
    return [(128, 64, 128, 8), (128, 80, 128, 8)]


def case(device, shape, state_dtype, rows, tokens, act=torch.bfloat16):
    """A prefill's tail inputs: y and its gate (a column slice of a wider projection, as the
    model's), the norm, a state cache whose slots lie apart (vLLM's padded views) with its
    scales for int8, distinct slots and the final states in the scan's dtype."""
    nheads, head_dim, d_state, groups = shape
    hidden = nheads * head_dim
    projection = torch.randn(tokens, 2 * hidden + 7, device=device).to(act)
    per_slot = nheads * head_dim * d_state
    flat = torch.randn(NUM_SLOTS, per_slot + 40, device=device)
    if state_dtype == torch.int8:
        flat = flat.mul(40).round().clamp(-127, 127)
    state = flat.to(state_dtype)[:, :per_slot].view(NUM_SLOTS, nheads, head_dim, d_state)
    scale = None
    if state_dtype == torch.int8:
        scale = torch.rand(NUM_SLOTS, nheads * head_dim + 5, device=device)
        scale = scale[:, : nheads * head_dim].view(NUM_SLOTS, nheads, head_dim)
    scan_dtype = torch.float32 if state_dtype == torch.int8 else state_dtype
    # every other row of a larger buffer: each row contiguous, the rows spaced apart
    values = torch.randn(2 * rows, nheads, head_dim, d_state, device=device) * 3
    return dict(
        y=torch.randn(tokens, hidden, device=device).to(act),
        gate=projection[:, 3 : 3 + hidden],
        norm=GroupNorm(torch.randn(hidden, device=device).to(act), hidden // groups, EPS),
        ssm_state=state,
        ssm_scale=scale,
        slots=torch.randperm(NUM_SLOTS, device=device)[:rows],
        values=values.to(scan_dtype)[::2],
    )


def run(fn, t, slots=None):
    """``fn`` on copies of the tensors it writes (slots replaced by ``slots``); returns the
    inputs with those copies (the values keep their strides: a clone would make them dense)."""
    written = ("y", "ssm_state", "ssm_scale")
    out = {k: (v.clone() if k in written and v is not None else v) for k, v in t.items()}
    if slots is not None:
        out["slots"] = slots
    states = FinalStates(out["ssm_state"], out["ssm_scale"], out["slots"], out["values"])
    fn(out["y"], out["gate"], out["norm"], states)
    return out


def public(y, gate, norm, s):
    mamba2_prefill_tail(
        y, gate, norm.weight, norm.group_size, norm.eps, s.ssm_state, s.slots, s.values, s.ssm_scale
    )


def y_tolerance(device, act):
    return 5e-2 if device == "cpu" and act == torch.bfloat16 else TOL[act]


def assert_states_match(got, want):
    """Written slots as the reference writes them (int8: within one quantum, scales equal
    to fp32 rounding); every other slot untouched, bit for bit."""
    slots = want["slots"].long().cpu()
    others = torch.ones(NUM_SLOTS, dtype=torch.bool)
    others[slots] = False
    state, ref = got["ssm_state"].cpu(), want["ssm_state"].cpu()
    assert torch.equal(state[others], ref[others])
    if got["ssm_scale"] is None:
        assert torch.equal(state, ref)
        return
    scale, ref_scale = got["ssm_scale"].cpu(), want["ssm_scale"].cpu()
    assert torch.equal(scale[others], ref_scale[others])
    torch.testing.assert_close(scale[slots], ref_scale[slots], rtol=1e-6, atol=0)
    assert_int8_state_close(state[slots], scale[slots], ref[slots], ref_scale[slots])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_matches_reference(device, state_dtype, slot_dtype):
    for shape in shapes(device):
        t = case(device, shape, state_dtype, rows=4, tokens=11)
        t["slots"] = t["slots"].to(slot_dtype)
        # poisoned targets: every element of the written slots must come from the values
        t["ssm_state"][t["slots"].long()] = (
            poisoned(t["values"]) if state_dtype.is_floating_point else 0
        )
        want = run(mamba2_prefill_tail_reference, t)
        # the slots as a column of vLLM's block table: a strided view
        column = torch.stack([t["slots"], (t["slots"] + 1) % NUM_SLOTS], dim=1)[:, 0]
        for slots in (t["slots"], column):
            got = run(public, t, slots)
            assert rel_err(got["y"], want["y"]) < y_tolerance(device, torch.bfloat16)
            assert_states_match(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.int8])
def test_states_alone(device, state_dtype):
    """The launch without norm rows (the prefix-caching checkpoints' state writes)."""
    t = case(device, shapes(device)[0], state_dtype, rows=3, tokens=2)
    want = run(mamba2_prefill_tail_reference, t)
    got = run(lambda y, gate, norm, states: kernel.launch(None, None, None, states), t)
    assert torch.equal(got["y"], t["y"])
    assert_states_match(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_int8_rows_of_zeros_huge_values_and_nan(device):
    """A zero row stores scale 0; huge rows keep their quantum; a NaN row stays in its own
    row and slot: the other rows of its sequence and the other sequences are as without it."""
    t = case(device, shapes(device)[0], torch.int8, rows=3, tokens=2)
    values = t["values"]
    values[0, 0, 0] = 0.0
    values[1, 0, 1] = 3e37
    clean = run(mamba2_prefill_tail_reference, t)
    values[2, 1, 2, 5] = float("nan")
    got = run(public, t)
    slots = t["slots"].long()
    scale, q = got["ssm_scale"][slots].cpu(), got["ssm_state"][slots].cpu()
    assert scale[0, 0, 0] == 0 and (q[0, 0, 0] == 0).all()
    assert scale[1, 0, 1] == pytest.approx(3e37 / 127, rel=1e-6)
    nan_row = torch.zeros_like(scale, dtype=torch.bool)
    nan_row[2, 1, 2] = True
    ref_q, ref_scale = clean["ssm_state"][slots].cpu(), clean["ssm_scale"][slots].cpu()
    assert_int8_state_close(q[~nan_row], scale[~nan_row], ref_q[~nan_row], ref_scale[~nan_row])
    others = torch.ones(NUM_SLOTS, dtype=torch.bool)
    others[slots.cpu()] = False
    assert torch.equal(got["ssm_state"].cpu()[others], t["ssm_state"].cpu()[others])


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows_and_no_tokens(device):
    t = case(device, shapes(device)[0], torch.float32, rows=0, tokens=0)
    got = run(public, t)
    assert torch.equal(got["ssm_state"], t["ssm_state"])


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_cpu_path_matches_reference(state_dtype):
    """The CPU serving path against the literal reference."""
    t = case("cpu", (3, 8, 16, 3), state_dtype, rows=4, tokens=5, act=torch.float32)
    want = run(mamba2_prefill_tail_reference, t)
    got = run(mamba2_prefill_tail_cpu, t)
    assert rel_err(got["y"], want["y"]) < TOL[torch.float32]
    assert_states_match(got, want)


def test_bad_arguments_raise():
    t = case("cpu", (3, 8, 16, 3), torch.int8, rows=2, tokens=3, act=torch.float32)
    scale = t["ssm_scale"]

    def call(**changes):
        a = {**t, **changes}
        states = FinalStates(a["ssm_state"], a["ssm_scale"], a["slots"], a["values"])
        public(a["y"], a["gate"], a["norm"], states)

    with pytest.raises(ValueError, match="gate must have shape"):
        call(gate=t["gate"][:2])
    with pytest.raises(ValueError, match="group_size must divide"):
        call(norm=GroupNorm(t["norm"].weight, 5))
    with pytest.raises(ValueError, match="ssm_scale must be a torch.Tensor"):
        call(ssm_scale=None)
    with pytest.raises(ValueError, match=r"final_states must have dtype in \(float32\)"):
        call(values=t["values"].bfloat16())
    with pytest.raises(ValueError, match="final_states must have shape"):
        call(values=t["values"][:1])
    with pytest.raises(ValueError, match="final_states must have each row contiguous"):
        call(values=t["values"].transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="ssm_scale is for an int8 ssm_state only"):
        call(ssm_state=t["ssm_state"].float(), ssm_scale=scale)
    with pytest.raises(ValueError, match="slots must have dtype"):
        call(slots=t["slots"].float())


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_one_launch_for_norm_and_states():
    """The point of the op: the norm and the state write cost the host one kernel launch."""
    t = case("cuda", shapes("cuda")[0], torch.bfloat16, rows=2, tokens=256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run(public, t)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("_prefill_tail_kernel" in n for n in names) == 1
