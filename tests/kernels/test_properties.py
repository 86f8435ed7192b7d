"""Property tests over shapes, dtypes and strides for every kernel entry point: the result
equals the reference, or a ValueError names the argument. Never a crash or a silent wrong
answer. (CPU: Triton interpreter, small shapes; hypothesis draws fresh cases every run.)
The count of cases and outcomes goes into docs/reliability.md."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import GPU, TOL, rel_err
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_nemotron_h.kernels import (
    causal_conv1d_update,
    causal_conv1d_update_ref,
    group_rms_norm,
    group_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
    selective_state_update,
    selective_state_update_ref,
)

DEV = "cuda" if GPU else "cpu"
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OUTCOMES: Counter[tuple[str, str]] = Counter()  # (entry point, "equal" | "ValueError")


@pytest.fixture(autouse=True)
def report_outcomes(request, reliability_report):
    """After each property test that passed: its entry point's row in docs/reliability.md."""
    OUTCOMES.clear()
    yield
    if not getattr(request.node, "passed", False):
        return
    for entry in sorted({e for e, _ in OUTCOMES}):
        equal, refused = OUTCOMES[entry, "equal"], OUTCOMES[entry, "ValueError"]
        reliability_report.add(
            f"kernel arguments: {entry}",
            f"{equal + refused} random cases (hypothesis) over shapes, dtypes, strides, "
            f"slots{'' if GPU else ' (Triton interpreter)'}",
            f"{equal} equal to the reference, {refused} refused with a ValueError naming the "
            "argument (state untouched); no crash, no wrong answer",
        )


def refused(entry: str, match: str):
    OUTCOMES[entry, "ValueError"] += 1
    return pytest.raises(ValueError, match=match)


def equal(entry: str) -> None:
    OUTCOMES[entry, "equal"] += 1


def rnd(*shape, dtype=torch.float32, strided=False):
    if strided:  # every other column: last stride 2
        return torch.randn(*shape[:-1], 2 * shape[-1], device=DEV).to(dtype)[..., ::2]
    return torch.randn(*shape, device=DEV).to(dtype)


# One argument at a time made invalid (or none): about half the cases must be computed.
SSU_BROKEN = [None, None, None, ("head_dim", 8), ("head_dim", 130), ("d_state", 8),
              ("d_state", 300), ("ngroups", 5)]  # fmt: skip


@SETTINGS
@given(
    batch=st.integers(0, 3),
    nheads=st.sampled_from([2, 4, 6, 8]),
    head_dim=st.sampled_from([32, 48, 64, 80, 128]),
    d_state=st.sampled_from([16, 24, 64, 128, 256]),
    ngroups=st.sampled_from([1, 2]),
    broken=st.sampled_from(SSU_BROKEN),
    state_dtype=DTYPES,
    act=DTYPES,
    gate=st.booleans(),
    slots=st.booleans(),
    strided_x=st.booleans(),
)
def test_selective_state_update_property(
    batch, nheads, head_dim, d_state, ngroups, broken, state_dtype, act, gate, slots, strided_x
):
    sizes = dict(head_dim=head_dim, d_state=d_state, ngroups=ngroups)
    if broken:
        sizes[broken[0]] = broken[1]
    head_dim, d_state, ngroups = sizes.values()
    state = rnd(batch + 2, nheads, head_dim, d_state, dtype=state_dtype)
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
    if bad:
        with refused("selective_state_update", bad[0]):
            selective_state_update(state, **args, null_slot=0)
        assert torch.equal(state, s_ref), "a refused call must not touch the state"
        return
    ref = selective_state_update_ref(s_ref, **args, null_slot=0)
    out = selective_state_update(state, **args, null_slot=0)
    equal("selective_state_update")
    if batch:
        tol = max(TOL[act], TOL[state_dtype])
        assert rel_err(out, ref) < tol
        assert rel_err(state, s_ref) < tol


CONV_BROKEN = [None, None, None, "x must be contiguous", "conv width", "activation"]


@SETTINGS
@given(
    batch=st.integers(0, 3),
    dim=st.integers(1, 300),
    width=st.integers(2, 4),
    dtype=DTYPES,
    bias=st.booleans(),
    act=st.sampled_from([None, "silu"]),
    broken=st.sampled_from(CONV_BROKEN),
    bad_width=st.sampled_from([1, 5]),
)
def test_causal_conv1d_update_property(batch, dim, width, dtype, bias, act, broken, bad_width):
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
    ref = causal_conv1d_update_ref(x, s_ref, **args)
    out = causal_conv1d_update(x, state, **args)
    equal("causal_conv1d_update")
    if batch:
        assert rel_err(out, ref) < TOL[dtype]
        assert rel_err(state, s_ref) < TOL[dtype]


@SETTINGS
@given(
    rows=st.integers(0, 4),
    groups=st.integers(1, 4),
    group_size=st.integers(1, 70),
    dtype=DTYPES,
    gate=st.booleans(),
    bad_group=st.booleans(),
)
def test_group_rms_norm_property(rows, groups, group_size, dtype, gate, bad_group):
    hidden = groups * group_size
    x, w = rnd(rows, hidden, dtype=dtype), rnd(hidden, dtype=dtype)
    z = rnd(rows, hidden, dtype=dtype) if gate else None
    gs = group_size + 1 if bad_group else group_size
    if hidden % gs:
        with refused("group_rms_norm", "group_size"):
            group_rms_norm(x, w, gs, 1e-5, z)
        return
    out = group_rms_norm(x, w, gs, 1e-5, z)
    equal("group_rms_norm")
    if rows:
        assert rel_err(out, group_rms_norm_ref(x, w, gs, 1e-5, z)) < TOL[dtype]


@SETTINGS
@given(
    rows=st.integers(0, 4),
    hidden=st.integers(1, 300),
    dtype=DTYPES,
    residual=st.booleans(),
    strided_x=st.sampled_from([False, False, True]),
    weight_len=st.sampled_from([0, 0, 1]),  # 1: a weight one element too long
)
def test_rms_norm_property(rows, hidden, dtype, residual, strided_x, weight_len):
    x = rnd(rows, hidden, dtype=dtype, strided=strided_x)
    w = rnd(hidden + weight_len, dtype=dtype)
    res = rnd(rows, hidden, dtype=dtype) if residual else None
    bad = [
        name
        for name, fine in [
            ("x must be contiguous", not (strided_x and hidden > 1)),
            ("weight must have shape", not weight_len),
        ]
        if not fine
    ]
    if bad:
        with refused("rms_norm", bad[0]):
            rms_norm(x, w, 1e-5, res)
        return
    out = rms_norm(x, w, 1e-5, res)
    equal("rms_norm")
    want = rms_norm_ref(x, w, 1e-5, res)
    if residual:
        assert rel_err(out[0], want[0]) < TOL[dtype] and rel_err(out[1], want[1]) < TOL[dtype]
    elif rows:
        assert rel_err(out, want) < TOL[dtype]
