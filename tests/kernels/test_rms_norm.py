import pytest
import torch
from helpers import DEVICES, TOL, rel_err

from vllm_nemotron_h.ops import group_rms_norm
from vllm_nemotron_h.ops.rms_norm.args import GroupNorm
from vllm_nemotron_h.ops.rms_norm.cpu import group_rms_norm_cpu
from vllm_nemotron_h.ops.rms_norm.reference import group_rms_norm_reference


def rnd(device, *shape, dtype=torch.float32):
    return torch.randn(*shape, device=device).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gate", [True, False])
def test_group_rms_norm_matches_reference(device, dtype, gate):
    cases = (
        ((96, 24), (160, 160)) if device == "cpu" else ((8192, 1024), (10240, 1280), (4096, 512))
    )
    for hidden, group in cases:
        x = rnd(device, 4, hidden, dtype=dtype)
        z = rnd(device, 4, hidden, dtype=dtype) if gate else None
        w = rnd(device, hidden, dtype=dtype)
        ref = group_rms_norm_reference(x, GroupNorm(w, group), z)
        assert rel_err(group_rms_norm(x, w, group, 1e-5, z), ref) < TOL[dtype]
        # in place, as the model calls it: the result lands in x, nothing else is returned
        assert group_rms_norm(x, w, group, 1e-5, z, out=x) is x
        assert rel_err(x, ref) < TOL[dtype]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="group_size"):
        group_rms_norm(torch.zeros(2, 10), torch.ones(10), 3, 1e-5)
    with pytest.raises(ValueError, match="out must have x's dtype"):
        group_rms_norm(torch.zeros(2, 10), torch.ones(10), 5, 1e-5, out=torch.zeros(2, 10).half())
    with pytest.raises(ValueError, match="weight must have shape"):
        group_rms_norm(torch.zeros(2, 10), torch.ones(9), 5, 1e-5)
    with pytest.raises(ValueError, match="z must have shape"):
        group_rms_norm(torch.zeros(2, 10), torch.ones(10), 5, 1e-5, z=torch.zeros(3, 10))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_matches_reference(dtype):
    """The CPU serving path against the literal reference."""
    x, z = (rnd("cpu", 4, 96, dtype=dtype) for _ in range(2))
    w = rnd("cpu", 96, dtype=dtype)
    got = group_rms_norm_cpu(x, GroupNorm(w, 24), z)
    assert rel_err(got, group_rms_norm_reference(x, GroupNorm(w, 24), z)) < TOL[dtype]
