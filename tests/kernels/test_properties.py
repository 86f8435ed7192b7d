"""Property tests over shapes, dtypes and strides for every kernel entry point: the result
equals the reference, or a ValueError names the argument. Never a crash or a silent wrong
answer. (CPU: Triton interpreter, small shapes; hypothesis draws fresh cases every run.)"""

from __future__ import annotations

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
    selective_state_update,
    selective_state_update_ref,
)

DEV = "cuda" if GPU else "cpu"
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rnd(*shape, dtype=torch.float32, strided=False):
    if strided:  # every other column: last stride 2
        return torch.randn(*shape[:-1], 2 * shape[-1], device=DEV).to(dtype)[..., ::2]
    return torch.randn(*shape, device=DEV).to(dtype)


@SETTINGS
@given(
    batch=st.integers(0, 3),
    nheads=st.sampled_from([1, 2, 4, 6]),
    head_dim=st.sampled_from([8, 32, 48, 80, 130]),
    d_state=st.sampled_from([8, 16, 24, 64, 300]),
    ngroups=st.sampled_from([1, 2, 3]),
    state_dtype=DTYPES,
    act=DTYPES,
    gate=st.booleans(),
    slots=st.booleans(),
    strided_x=st.booleans(),
)
def test_selective_state_update_property(
    batch, nheads, head_dim, d_state, ngroups, state_dtype, act, gate, slots, strided_x
):
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
    ok = 32 <= head_dim <= 128 and 16 <= d_state <= 256 and nheads % ngroups == 0
    s_ref = state.clone()
    if not ok:
        with pytest.raises(ValueError):
            selective_state_update(state, **args, null_slot=0)
        assert torch.equal(state, s_ref), "a refused call must not touch the state"
        return
    ref = selective_state_update_ref(s_ref, **args, null_slot=0)
    out = selective_state_update(state, **args, null_slot=0)
    if batch:
        tol = max(TOL[act], TOL[state_dtype])
        assert rel_err(out, ref) < tol
        assert rel_err(state, s_ref) < tol


@SETTINGS
@given(
    batch=st.integers(0, 3),
    dim=st.integers(1, 300),
    width=st.integers(1, 5),
    dtype=DTYPES,
    bias=st.booleans(),
    strided_x=st.booleans(),
    act=st.sampled_from([None, "silu", "relu"]),
)
def test_causal_conv1d_update_property(batch, dim, width, dtype, bias, strided_x, act):
    state = rnd(batch + 2, dim, max(width - 1, 1), dtype=dtype)
    x = rnd(batch, dim, dtype=dtype, strided=strided_x)
    args = dict(
        weight=rnd(dim, width, dtype=dtype),
        bias=rnd(dim, dtype=dtype) if bias else None,
        activation=act,
        state_slots=torch.randperm(batch + 1, device=DEV)[:batch] + 1,
        null_slot=0,
    )
    ok = 2 <= width <= 4 and act != "relu" and not (strided_x and dim > 1)
    s_ref = state.clone()
    if not ok:
        with pytest.raises(ValueError):
            causal_conv1d_update(x, state, **args)
        assert torch.equal(state, s_ref)
        return
    ref = causal_conv1d_update_ref(x, s_ref, **args)
    out = causal_conv1d_update(x, state, **args)
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
        with pytest.raises(ValueError, match="group_size"):
            group_rms_norm(x, w, gs, 1e-5, z)
        return
    out = group_rms_norm(x, w, gs, 1e-5, z)
    if rows:
        assert rel_err(out, group_rms_norm_ref(x, w, gs, 1e-5, z)) < TOL[dtype]
