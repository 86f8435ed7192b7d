"""Property tests over shapes, dtypes and strides for every kernel entry point: the result
equals the reference, or a ValueError names the argument. Never a crash or a silent wrong
answer. And over model configs: the loader's check refuses a config naming a field that is
really out of range, or accepts it, and then every kernel takes its per-rank shapes.
(CPU: Triton interpreter, small shapes; hypothesis draws fresh cases every run.)
The count of cases and outcomes goes into the reliability table (tests/reliability_report.py)."""

from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from helpers import GPU, TOL, assert_int8_state_close, decode_records, rel_err, tolerance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.config_fakes import fake_vllm_config
from vllm_nemotron_h.model_executor.validation import (
    SPECULATIVE_METHODS,
    UnsupportedConfigError,
    hand_back_reason,
    validate,
)
from vllm_nemotron_h.ops import (
    DecodeWorkspace,
    causal_conv1d_update,
    gather_state_slots,
    group_rms_norm,
    mamba2_decode,
    mamba2_prefill_tail,
    scatter_state_slots,
    selective_state_update,
)
from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep
from vllm_nemotron_h.ops.causal_conv1d_update.reference import causal_conv1d_update_reference
from vllm_nemotron_h.ops.mamba2_decode.reference import mamba2_decode_reference
from vllm_nemotron_h.ops.mamba2_prefill_tail.args import FinalStates
from vllm_nemotron_h.ops.mamba2_prefill_tail.reference import mamba2_prefill_tail_reference
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.reference import group_rms_norm_reference
from vllm_nemotron_h.ops.selective_state_update.args import StateUpdateStep
from vllm_nemotron_h.ops.selective_state_update.reference import (
    selective_state_update_reference,
)
from vllm_nemotron_h.ops.state_format import quantize
from vllm_nemotron_h.ops.state_slot_copy.reference import (
    gather_state_slots_reference,
    scatter_state_slots_reference,
)

DEV = "cuda" if GPU else "cpu"
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
# Every tensor comes from torch's generator seeded with a drawn seed: hypothesis prints it with
# a failing example, and the example replays exactly.
SEEDS = st.integers(0, 2**32 - 1)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OUTCOMES: Counter[tuple[str, str]] = Counter()  # (entry point, "ok" | "refused")
WHERE = "" if GPU else " (Triton interpreter)"
KERNEL_ROW = (
    "kernel arguments: {entry}",
    "{n} random cases (hypothesis) over shapes, dtypes, strides, slots" + WHERE,
    "{ok} equal to the reference, {empty} empty batches (nothing written), {refused} refused "
    "with a ValueError naming the argument (state untouched); no crash, no wrong answer",
)
CONFIG_ROW = (
    "model configs",
    "{n} random configs (hypothesis): layer pattern, heads, n_groups, head_dim, d_state, conv "
    "width, conv activation, tensor-parallel size, Mamba cache mode, speculative tokens" + WHERE,
    "{refused} refused at load naming a field no Nemotron-H model can have; {handed} handed "
    "back to vLLM's model naming the field the plugin does not run; {ok} accepted, and every "
    "kernel then took the accepted config's per-rank shapes",
)


@pytest.fixture(autouse=True)
def report_outcomes(request, reliability_report):
    """After each property test that passed: its rows in the reliability table."""
    OUTCOMES.clear()
    yield
    if not getattr(request.node, "passed", False):
        return
    for entry in sorted({e for e, _ in OUTCOMES}):
        ok, refused = OUTCOMES[entry, "ok"], OUTCOMES[entry, "refused"]
        empty, handed = OUTCOMES[entry, "empty"], OUTCOMES[entry, "handed back"]
        rows = CONFIG_ROW if entry == "config" else KERNEL_ROW
        n = ok + empty + refused + handed
        check, tried, result = (
            text.format(entry=entry, n=n, ok=ok, empty=empty, refused=refused, handed=handed)
            for text in rows
        )
        reliability_report.add(check, tried, result)


def refused(entry: str, match: str, error: type[Exception] = ValueError):
    OUTCOMES[entry, "refused"] += 1
    return pytest.raises(error, match=match)


def equal(entry: str, compared: bool = True) -> None:
    """A computed case: "ok" once its output was compared with the reference's, "empty" for an
    empty batch (no output to compare; where there is a state, it was checked untouched)."""
    OUTCOMES[entry, "ok" if compared else "empty"] += 1


def rnd(*shape, dtype=torch.float32, strided=False):
    if strided:  # every other column: last stride 2
        return torch.randn(*shape[:-1], 2 * shape[-1], device=DEV).to(dtype)[..., ::2]
    return torch.randn(*shape, device=DEV).to(dtype)


# One argument at a time made invalid (or none): about half the cases must be computed.
SSU_BROKEN = [None, None, None, ("head_dim", 8), ("head_dim", 130), ("d_state", 8),
              ("d_state", 300), ("ngroups", 5)]  # fmt: skip


@SETTINGS
@given(
    seed=SEEDS,
    batch=st.integers(0, 3),
    nheads=st.sampled_from([2, 4, 6, 8]),
    head_dim=st.sampled_from([32, 48, 64, 80, 128]),
    d_state=st.sampled_from([16, 24, 64, 128, 256]),
    ngroups=st.sampled_from([1, 2]),
    broken=st.sampled_from(SSU_BROKEN),
    state_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8]),
    act=DTYPES,
    gate=st.booleans(),
    slots=st.booleans(),
    strided_x=st.booleans(),
)
def test_selective_state_update_property(
    seed,
    batch,
    nheads,
    head_dim,
    d_state,
    ngroups,
    broken,
    state_dtype,
    act,
    gate,
    slots,
    strided_x,
):
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    sizes = dict(head_dim=head_dim, d_state=d_state, ngroups=ngroups)
    if broken:
        sizes[broken[0]] = broken[1]
    head_dim, d_state, ngroups = sizes.values()
    if state_dtype == torch.int8:  # int8 rows and their fp32 scales (ops/state_format.py)
        state, scale = quantize(rnd(batch + 2, nheads, head_dim, d_state))
    else:
        state, scale = rnd(batch + 2, nheads, head_dim, d_state, dtype=state_dtype), None
    x = rnd(batch, nheads, head_dim, dtype=act, strided=strided_x)
    args = dict(
        x=x,
        dt=rnd(batch, nheads, dtype=act),
        A=-torch.rand(nheads, device=DEV),
        B=rnd(batch, ngroups, d_state, dtype=act),
        C=rnd(batch, ngroups, d_state, dtype=act),
        D=rnd(nheads),
        dt_bias=rnd(nheads),
        z=rnd(batch, nheads, head_dim, dtype=act) if gate else None,
        state_slots=(torch.randperm(batch + 1, device=DEV)[:batch] + 1) if slots else None,
    )
    # any strides of x are fine (the kernel takes them); the state needs unit last stride
    bad = [broken[0]] if broken else []
    s_ref = state.clone()
    scale_ref = scale.clone() if scale is not None else None
    if bad:
        with refused("selective_state_update", bad[0]):
            selective_state_update(state, **args, null_slot=0, state_scale=scale)
        assert torch.equal(state, s_ref), "a refused call must not touch the state"
        return
    ref = selective_state_update_reference(s_ref, StateUpdateStep(**args, null_slot=0), scale_ref)
    out = selective_state_update(state, **args, null_slot=0, state_scale=scale)
    equal("selective_state_update", compared=bool(batch))
    if scale is None:
        tol = max(TOL[act], TOL[state_dtype])
        assert rel_err(state, s_ref) < tol
    else:  # within one quantum of the reference's rows (a value on a rounding boundary)
        tol = TOL[act]
        assert_int8_state_close(state, scale, s_ref, scale_ref)
    if batch:
        assert rel_err(out, ref) < tol


CONV_BROKEN = [None, None, None, "x must be contiguous", "conv width", "activation"]


@SETTINGS
@given(
    seed=SEEDS,
    batch=st.integers(0, 3),
    dim=st.integers(1, 300),
    width=st.integers(2, 4),
    dtype=DTYPES,
    bias=st.booleans(),
    act=st.sampled_from([None, "silu"]),
    broken=st.sampled_from(CONV_BROKEN),
    bad_width=st.sampled_from([1, 5]),
)
def test_causal_conv1d_update_property(
    seed, batch, dim, width, dtype, bias, act, broken, bad_width
):
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    if broken == "x must be contiguous":
        dim = max(dim, 2)  # a single column has no stride to get wrong
    width = bad_width if broken == "conv width" else width
    act = "relu" if broken == "activation" else act
    state = rnd(batch + 2, dim, max(width - 1, 1), dtype=dtype)
    x = rnd(batch, dim, dtype=dtype, strided=broken == "x must be contiguous")
    args = dict(
        weight=rnd(dim, width, dtype=dtype),
        bias=rnd(dim, dtype=dtype) if bias else None,
        activation=act,
        state_slots=torch.randperm(batch + 1, device=DEV)[:batch] + 1,
        null_slot=0,
    )
    bad = [broken] if broken else []
    s_ref = state.clone()
    if bad:
        with refused("causal_conv1d_update", bad[0]):
            causal_conv1d_update(x, state, **args)
        assert torch.equal(state, s_ref)
        return
    ref = causal_conv1d_update_reference(ConvUpdateStep(x, s_ref, **args))
    out = causal_conv1d_update(x, state, **args)
    equal("causal_conv1d_update", compared=bool(batch))
    assert rel_err(state, s_ref) < TOL[dtype]
    if batch:
        assert rel_err(out, ref) < TOL[dtype]


# One argument at a time made invalid (or none), as for the state update.
DECODE_BROKEN = [None, None, None, None, "xbc.shape", "conv width", "norm_weight", "workspace"]


@SETTINGS
@given(
    seed=SEEDS,
    batch=st.integers(0, 3),
    nheads=st.sampled_from([2, 4]),
    head_dim=st.sampled_from([32, 34, 80]),
    d_state=st.sampled_from([16, 24, 64]),
    ngroups=st.sampled_from([1, 2]),
    width=st.integers(2, 4),
    state_dtype=DTYPES,
    act=DTYPES,
    norm=st.booleans(),
    fuse=st.sampled_from([None, True, False]),
    broken=st.sampled_from(DECODE_BROKEN),
)
def test_mamba2_decode_property(
    seed, batch, nheads, head_dim, d_state, ngroups, width, state_dtype, act, norm, fuse, broken
):
    """The mixer's decode entry point: one launch or three kernels, or a named refusal (a
    tile of < 4 rows, as head_dim 34 with one head per group gives, refuses fuse=True)."""
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    inner = nheads * head_dim
    conv_dim = inner + 2 * ngroups * d_state + (8 if broken == "xbc.shape" else 0)
    w = 5 if broken == "conv width" else width
    proj = rnd(batch, inner + conv_dim + nheads, dtype=act)  # z | xbc | dt, one row each
    states = dict(
        conv_state=rnd(batch + 2, conv_dim, max(w - 1, 1), dtype=act),
        ssm_state=rnd(batch + 2, nheads, head_dim, d_state, dtype=state_dtype),
    )
    args = dict(
        xbc=proj[:, inner : inner + conv_dim],
        dt=proj[:, inner + conv_dim :],
        z=proj[:, :inner],
        conv_weight=rnd(conv_dim, w, dtype=act),
        conv_bias=rnd(conv_dim, dtype=act),
        A=-torch.rand(nheads, device=DEV),
        D=rnd(nheads),
        dt_bias=rnd(nheads),
        norm_weight=rnd(inner + (4 if broken == "norm_weight" else 0), dtype=act) if norm else None,
        state_slots=torch.randperm(batch + 1, device=DEV)[:batch] + 1,
        null_slot=0,
    )
    space = 0 if broken == "workspace" else batch
    workspace = DecodeWorkspace.allocate(space, nheads, head_dim, DEV)
    group_rows = nheads // ngroups * head_dim
    small_tile = group_rows % 4 != 0  # head_dim 34, one head per group: tiles of 2 rows
    bad = [b for b in [broken] if b and (b != "norm_weight" or norm)]
    if broken == "workspace" and (fuse is False or small_tile and not fuse or not batch):
        bad = []  # the three kernels need no workspace; an empty batch needs no room
    if fuse and small_tile and bad in ([], ["workspace"]):
        bad = ["BLOCK_M"]  # refused before the workspace is looked at
    before = {k: v.clone() for k, v in states.items()}
    if bad:
        with refused("mamba2_decode", bad[0]):
            mamba2_decode(**args, **states, workspace=workspace, fuse=fuse)
        for k in states:
            assert torch.equal(states[k], before[k]), "a refused call must not touch the state"
        return
    refs = {k: v.clone() for k, v in states.items()}
    ref = mamba2_decode_reference(*decode_records({**args, **refs}))
    out = mamba2_decode(**args, **states, workspace=workspace, fuse=fuse)
    equal("mamba2_decode", compared=bool(batch))
    tol = tolerance(act, state_dtype, DEV)
    for k in states:
        assert rel_err(states[k], refs[k]) < tol
    if batch:
        assert rel_err(out, ref) < tol


SLOT_COPY_BROKEN = [None, None, None, "slots float", "values dtype", "values shape",
                    "slot not contiguous", "has_initial length"]  # fmt: skip
# A prefill's rows over a small state cache (the slot copies' draws)
SLOT_ROWS = dict(
    seed=SEEDS,
    num_slots=st.integers(1, 6),
    rows=st.integers(0, 6),
    slot_dtype=st.sampled_from([torch.int32, torch.int64]),
    pad=st.sampled_from([0, 0, 8]),
    initial=st.sampled_from(["none", "all", "some"]),
)


def slots_and_flags(num_slots: int, rows: int, slot_dtype, initial: str):
    """``rows`` distinct slots and the has-initial-state flags ``initial`` names."""
    slots = torch.randperm(num_slots, device=DEV)[:rows].to(slot_dtype)
    flags = {
        "none": None,
        "all": torch.ones(rows, dtype=torch.bool, device=DEV),
        "some": torch.rand(rows, device=DEV) < 0.5,
    }[initial]
    return slots, flags


@SETTINGS
@given(
    **SLOT_ROWS,
    per_slot=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    dtype=DTYPES,
    broken=st.sampled_from(SLOT_COPY_BROKEN),
)
def test_state_slot_copy_property(
    seed, num_slots, rows, per_slot, dtype, slot_dtype, pad, initial, broken
):
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    rows = min(rows, num_slots)  # slots are distinct
    n = 1
    for d in per_slot:
        n *= d
    state = rnd(num_slots, n + pad, dtype=dtype)[:, :n].view(num_slots, *per_slot)
    if broken == "slot not contiguous":
        state = state.transpose(1, -1)
        if state[0].is_contiguous():  # one dim, or the swapped dims of size 1: still valid
            broken = None
    slots, flags = slots_and_flags(num_slots, rows, slot_dtype, initial)
    values = rnd(rows, *state.shape[1:], dtype=dtype)
    if broken == "slots float":
        slots = slots.float()
    elif broken == "values dtype":
        values = values.to(torch.float64)
    elif broken == "values shape":
        values = values[..., :-1] if values.shape[-1] > 1 else values[:, None]
    elif broken == "has_initial length":
        flags = torch.ones(rows + 1, dtype=torch.bool, device=DEV)
    before = state.clone()
    if broken is not None:
        match = {
            "slots float": "slots must have dtype",
            "values dtype": "values must have state's dtype",
            "values shape": "values must have shape",
            "slot not contiguous": "each slot contiguous",
            "has_initial length": "has_initial must have shape",
        }[broken]
        entry = "gather_state_slots" if broken == "has_initial length" else "scatter_state_slots"
        with refused(entry, match):
            if entry == "gather_state_slots":
                gather_state_slots(state, slots, flags)
            else:
                scatter_state_slots(state, slots, values)
        assert torch.equal(state, before)  # a refusal writes nothing
        return
    got = gather_state_slots(state, slots, flags)
    equal("gather_state_slots", compared=bool(rows))
    assert torch.equal(got, gather_state_slots_reference(state, slots, flags))
    expected = before.clone()
    scatter_state_slots_reference(expected, slots, values)
    scatter_state_slots(state, slots, values)
    equal("scatter_state_slots", compared=bool(rows))
    assert torch.equal(state, expected)


INT8_GATHER_BROKEN = [None, None, None, "state not int8", "scale shape", "scale dtype",
                      "scale slot not contiguous"]  # fmt: skip


@SETTINGS
@given(
    **SLOT_ROWS,
    per_slot=st.lists(st.integers(1, 40), min_size=2, max_size=3),
    broken=st.sampled_from(INT8_GATHER_BROKEN),
)
def test_int8_gather_dequantizes_property(
    seed, num_slots, rows, per_slot, slot_dtype, pad, initial, broken
):
    """gather_state_slots with an int8 state's scales: fp32 rows equal to the reference's
    (each element times its d_state row's scale), or a ValueError naming the argument."""
    torch.manual_seed(seed)
    rows = min(rows, num_slots)
    n = 1
    for d in per_slot:
        n *= d
    flat = torch.randint(-127, 128, (num_slots, n + pad), device=DEV, dtype=torch.int8)
    q = flat[:, :n].view(num_slots, *per_slot)
    scale = torch.rand(num_slots, *per_slot[:-1], device=DEV) * (torch.rand(()) < 0.8)
    slots, flags = slots_and_flags(num_slots, rows, slot_dtype, initial)
    if broken == "scale slot not contiguous":  # every other element of a wider tensor
        scale = torch.stack([scale, scale], dim=-1)[..., 0]
        if scale[0].is_contiguous():  # a slot of one scale: still valid
            broken = None
    match = {
        "state not int8": "int8 state only",
        "scale shape": "scale must have shape",
        "scale dtype": "scale must have dtype",
        "scale slot not contiguous": "scale must have each slot contiguous",
    }.get(broken)
    if broken == "state not int8":
        q = q.float()
    elif broken == "scale shape":
        scale = scale[..., None]
    elif broken == "scale dtype":
        scale = scale.half()
    if match is not None:
        with refused("gather_state_slots (int8, dequantized)", match):
            gather_state_slots(q, slots, flags, scale)
        return
    got = gather_state_slots(q, slots, flags, scale)
    equal("gather_state_slots (int8, dequantized)", compared=bool(rows))
    assert torch.equal(got, gather_state_slots_reference(q, slots, flags, scale))


PREFILL_TAIL_BROKEN = [None, None, None, "slots float", "final_states dtype",
                       "final_states shape", "gate shape", "ssm_scale missing"]  # fmt: skip


@SETTINGS
@given(
    seed=SEEDS,
    num_slots=st.integers(1, 6),
    rows=st.integers(0, 6),
    tokens=st.integers(0, 5),
    nheads=st.integers(1, 3),
    head_dim=st.integers(1, 12),
    d_state=st.sampled_from([16, 24, 64]),
    groups=st.integers(1, 3),
    group_size=st.integers(1, 40),
    state_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8]),
    act=DTYPES,
    slot_dtype=st.sampled_from([torch.int32, torch.int64]),
    pad=st.sampled_from([0, 0, 8]),
    broken=st.sampled_from(PREFILL_TAIL_BROKEN),
)
def test_mamba2_prefill_tail_property(
    seed, num_slots, rows, tokens, nheads, head_dim, d_state, groups, group_size, state_dtype,
    act, slot_dtype, pad, broken,
):  # fmt: skip
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    rows = min(rows, num_slots)  # slots are distinct
    hidden, n = groups * group_size, nheads * head_dim * d_state
    y, gate, w = (
        rnd(*shape, dtype=act) for shape in ((tokens, hidden), (tokens, hidden), (hidden,))
    )
    quantized = state_dtype == torch.int8
    flat = rnd(num_slots, n + pad)
    state = (flat.mul(40).round().clamp(-127, 127) if quantized else flat).to(state_dtype)
    state = state[:, :n].view(num_slots, nheads, head_dim, d_state)
    scale = rnd(num_slots, nheads, head_dim).abs() if quantized else None
    slots = torch.randperm(num_slots, device=DEV)[:rows].to(slot_dtype)
    values = rnd(rows, nheads, head_dim, d_state, dtype=torch.float32 if quantized else state_dtype)
    match = None
    if broken == "slots float":
        slots, match = slots.float(), "slots must have dtype"
    elif broken == "final_states dtype":
        values, match = values.to(torch.float64), "final_states must have dtype"
    elif broken == "final_states shape":
        values, match = values[..., :-1], "final_states must have shape"
    elif broken == "gate shape":
        gate, match = gate[:, :-1] if hidden > 1 else gate[:, None], "gate must have shape"
    elif broken == "ssm_scale missing" and quantized:
        scale, match = None, "ssm_scale must be a torch.Tensor"
    before = (y.clone(), state.clone(), None if scale is None else scale.clone())

    def call(states):
        mamba2_prefill_tail(
            y, gate, w, group_size, 1e-5, states.ssm_state, states.slots, states.values,
            states.ssm_scale,
        )  # fmt: skip

    if match is not None:
        with refused("mamba2_prefill_tail", match):
            call(FinalStates(state, scale, slots, values))
        assert torch.equal(y, before[0]) and torch.equal(state, before[1])  # nothing written
        return
    ref_y, ref_state = y.clone(), state.clone()
    ref_scale = None if scale is None else scale.clone()
    mamba2_prefill_tail_reference(
        ref_y, gate, GroupNorm(w, group_size), FinalStates(ref_state, ref_scale, slots, values)
    )
    call(FinalStates(state, scale, slots, values))
    equal("mamba2_prefill_tail", compared=bool(rows or tokens))
    if tokens:
        assert rel_err(y, ref_y) < tolerance(act, torch.float32, DEV)
    if not quantized:
        assert torch.equal(state, ref_state)
        return
    written = slots.long()
    others = torch.ones(num_slots, dtype=torch.bool, device=DEV)
    others[written] = False
    assert torch.equal(state[others], before[1][others]) and torch.equal(
        scale[others], before[2][others]
    )
    torch.testing.assert_close(scale[written], ref_scale[written], rtol=1e-6, atol=0)
    assert_int8_state_close(state[written], scale[written], ref_state[written], ref_scale[written])


@SETTINGS
@given(
    seed=SEEDS,
    rows=st.integers(0, 4),
    groups=st.integers(1, 4),
    group_size=st.integers(1, 70),
    dtype=DTYPES,
    gate=st.booleans(),
    bad_group=st.booleans(),
)
def test_group_rms_norm_property(seed, rows, groups, group_size, dtype, gate, bad_group):
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    hidden = groups * group_size
    x, w = rnd(rows, hidden, dtype=dtype), rnd(hidden, dtype=dtype)
    z = rnd(rows, hidden, dtype=dtype) if gate else None
    gs = group_size + 1 if bad_group else group_size
    if hidden % gs:
        with refused("group_rms_norm", "group_size"):
            group_rms_norm(x, w, gs, 1e-5, z)
        return
    out = group_rms_norm(x, w, gs, 1e-5, z)
    equal("group_rms_norm", compared=bool(rows))
    if rows:
        assert rel_err(out, group_rms_norm_reference(x, GroupNorm(w, gs), z)) < TOL[dtype]


# A supported config with at most one field set out of range (so that about half are
# accepted and run); which fields are out of range is judged from the values alone.
CONFIG_BROKEN = {
    None: {},
    "pattern": dict(hybrid_override_pattern="M-X"),
    "groups": dict(n_groups=3),
    "no_groups": dict(n_groups=0),
    "head_dim": dict(mamba_head_dim=160),
    "d_state": dict(ssm_state_size=512),
    "conv": dict(conv_kernel=5),
    "heads": dict(mamba_num_heads=6, tensor_parallel_size=4),
    "cache_mode": dict(mamba_cache_mode="all"),
    "spec_tokens": dict(num_speculative_tokens=2, speculative_method="eagle3"),
    "activation": dict(mamba_hidden_act="gelu"),
}
SUPPORTED_CONFIGS = st.fixed_dictionaries(
    dict(
        hybrid_override_pattern=st.sampled_from(["M-M*", "M*ME", "MM", "M*M-", "*-"]),
        mamba_num_heads=st.sampled_from([2, 4, 8]),
        n_groups=st.sampled_from([1, 2]),
        mamba_head_dim=st.sampled_from([32, 48, 64, 80, 128]),
        ssm_state_size=st.sampled_from([16, 64, 128, 256]),
        conv_kernel=st.sampled_from([2, 3, 4]),
        tensor_parallel_size=st.sampled_from([1, 2]),
        mamba_cache_mode=st.sampled_from(["none", "align"]),
        num_speculative_tokens=st.sampled_from([0, 3]),
        speculative_method=st.sampled_from(["ngram", "suffix"]),
        mamba_hidden_act=st.sampled_from(["silu", "swish"]),
    )
)


@settings(SETTINGS, max_examples=80)
@given(
    seed=SEEDS,
    fields=SUPPORTED_CONFIGS,
    broken=st.sampled_from([None] * 8 + list(CONFIG_BROKEN)[1:]),
)
def test_model_config_property(seed, fields, broken):
    """validate() refuses a config no Nemotron-H model can be, naming the field; otherwise
    hand_back_reason() names the first field the plugin does not run (vLLM's model serves
    it), or the plugin accepts it and the mixer's kernels then run at its per-rank shapes."""
    torch.manual_seed(seed)  # hypothesis draws the values through this seed
    c = SimpleNamespace(**{**fields, **CONFIG_BROKEN[broken]})
    vllm_config = fake_vllm_config(
        c,  # the extra fields are not read from there
        tensor_parallel_size=c.tensor_parallel_size,
        spec_tokens=c.num_speculative_tokens,
        spec_method=c.speculative_method,
        mamba_cache_mode=c.mamba_cache_mode,
    )
    heads, groups, tp = c.mamba_num_heads, c.n_groups, c.tensor_parallel_size
    mamba = "M" in c.hybrid_override_pattern

    def failing(checks: list[tuple[str, bool]]) -> set[str]:
        return {field for field, fine in checks if not fine}

    impossible = failing(
        [
            ("hybrid_override_pattern", set(c.hybrid_override_pattern) <= set("M*-E")),
            ("n_groups", not mamba or (groups > 0 and heads % groups == 0)),
        ]
    )
    not_run = failing(
        [
            ("n_groups", not mamba or groups <= 0 or groups == 1 or groups % tp == 0),
            ("mamba_head_dim", not mamba or 32 <= c.mamba_head_dim <= 128),
            ("ssm_state_size", not mamba or 16 <= c.ssm_state_size <= 256),
            ("conv_kernel", not mamba or 2 <= c.conv_kernel <= 4),
            ("mamba_num_heads", not mamba or heads % tp == 0),
            ("mamba_cache_mode", c.mamba_cache_mode != "all"),
            (
                "speculative_config.method",
                c.num_speculative_tokens == 0 or c.speculative_method in SPECULATIVE_METHODS,
            ),
            ("mamba_hidden_act", not mamba or c.mamba_hidden_act in ("silu", "swish")),
        ]
    )
    if impossible:
        with refused("config", "unsupported", UnsupportedConfigError) as err:
            validate(vllm_config)
        named = re.search(r"unsupported (\w+)=", str(err.value)).group(1)
        assert named in impossible, f"{named} named, but impossible: {impossible}"
        return
    validate(vllm_config)
    reason = hand_back_reason(vllm_config)
    if not_run:
        named = reason.split("=")[0]
        assert named in not_run, f"{named} named, but not run by the plugin: {not_run}"
        OUTCOMES["config", "handed back"] += 1
        return
    assert reason is None, reason
    equal("config")
    if mamba:
        run_mixer_kernels_at_rank_shapes(
            heads, groups, c.mamba_head_dim, c.ssm_state_size, c.conv_kernel, tp
        )


def run_mixer_kernels_at_rank_shapes(heads, groups, head_dim, d_state, conv, tp) -> None:
    """One decode token through the mixer's decode tail (mamba2_decode: conv update, state
    update, group norm), one launch and three kernels, with the shapes one tensor-parallel
    rank of an accepted config gets (as PluginMambaMixer2 splits them: n_groups 1 is
    replicated on every rank and its norm all-reduced instead, outside the kernel)."""
    heads_r = heads // tp
    groups_r = groups // tp if groups % tp == 0 else 1
    inner = heads_r * head_dim
    dim = inner + 2 * groups_r * d_state
    norm = None if tp > 1 and groups == 1 else rnd(inner)
    for fuse in (None, False):
        out = mamba2_decode(
            rnd(1, dim),
            rnd(1, heads_r),
            rnd(1, inner),
            rnd(2, dim, conv - 1),
            rnd(dim, conv),
            rnd(dim),
            rnd(2, heads_r, head_dim, d_state),
            -torch.rand(heads_r, device=DEV),
            rnd(heads_r),
            rnd(heads_r),
            norm_weight=norm,
            workspace=DecodeWorkspace.allocate(1, heads_r, head_dim, DEV),
            state_slots=torch.tensor([1], device=DEV),
            null_slot=0,
            fuse=fuse,
        )
        assert torch.isfinite(out).all()
