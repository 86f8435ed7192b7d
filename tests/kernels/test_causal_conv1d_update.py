import pytest
import torch
from helpers import DEVICES, TOL, draw, poisoned, rel_err

from vllm_nemotron_h.ops import causal_conv1d_update
from vllm_nemotron_h.ops.causal_conv1d_update.args import ConvUpdateStep
from vllm_nemotron_h.ops.causal_conv1d_update.cpu import causal_conv1d_update_cpu
from vllm_nemotron_h.ops.causal_conv1d_update.reference import causal_conv1d_update_reference
from vllm_nemotron_h.testing.op_inputs import conv_inputs


def make(device, batch, dim, width, dtype, state_dim_first, bias):
    return conv_inputs(draw(device), dim, width, batch, dtype, bias=bias, dim_first=state_dim_first)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("state_dim_first", [True, False])
def test_matches_reference(device, width, state_dim_first):
    dims = (40, 300) if device == "cpu" else (10240, 12288, 6144)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for dim in dims:
        for batch, bias, act in ((3, True, "silu"), (5, False, None)):
            t = make(device, batch, dim, width, dtype, state_dim_first, bias)
            s_ref = t["conv_state"].clone()
            ref = causal_conv1d_update_reference(
                ConvUpdateStep(**{**t, "conv_state": s_ref}, activation=act, null_slot=0)
            )
            out = poisoned(ref)
            before = t["conv_state"].clone()
            causal_conv1d_update(**t, activation=act, null_slot=0, out=out)
            assert rel_err(out, ref) < TOL[dtype]
            assert torch.equal(t["conv_state"], s_ref), "state shift must be exact"
            assert (out[-1] == 0).all()
            assert torch.equal(t["conv_state"][0], before[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_d", [128, 256, 512, 1024])
def test_every_block_size(device, block_d):
    dim = 300 if device == "cpu" else 10240
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    t = make(device, 3, dim, 4, dtype, False, True)
    s_ref = t["conv_state"].clone()
    ref = causal_conv1d_update_reference(ConvUpdateStep(**{**t, "conv_state": s_ref}, null_slot=0))
    out = poisoned(ref)
    causal_conv1d_update(**t, null_slot=0, out=out, config=(block_d, 4))
    assert rel_err(out, ref) < TOL[dtype]
    assert torch.equal(t["conv_state"], s_ref), "state shift must be exact"


def test_bad_arguments_raise():
    t = make("cpu", 2, 16, 4, torch.float32, True, True)
    with pytest.raises(ValueError, match="conv width"):
        causal_conv1d_update(**{**t, "weight": torch.zeros(16, 5)})
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_update(**t, activation="gelu")
    with pytest.raises(ValueError, match="conv_state must have shape"):
        causal_conv1d_update(**{**t, "conv_state": torch.zeros(4, 16, 2)})


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_matches_reference(width, dtype):
    """The CPU serving path against the literal reference."""
    t = make("cpu", 5, 72, width, dtype, state_dim_first=False, bias=True)
    s_ref = t["conv_state"].clone()
    ref = causal_conv1d_update_reference(ConvUpdateStep(**{**t, "conv_state": s_ref}, null_slot=0))
    out = poisoned(ref)
    causal_conv1d_update_cpu(ConvUpdateStep(**t, activation="silu", null_slot=0, out=out))
    assert rel_err(out, ref) < TOL[dtype] and (out[-1] == 0).all()
    assert torch.equal(t["conv_state"], s_ref), "state shift must be exact"
