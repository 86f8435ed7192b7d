import pytest
import torch
from helpers import DEVICES, poisoned

from vllm_nemotron_h.ops import gather_state_slots, scatter_state_slots
from vllm_nemotron_h.ops.state_format import dequantize
from vllm_nemotron_h.ops.state_slot_copy.cpu import gather_state_slots_cpu, scatter_state_slots_cpu
from vllm_nemotron_h.ops.state_slot_copy.reference import (
    gather_state_slots_reference,
    scatter_state_slots_reference,
)

STATE_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def state_cache(device, num_slots, per_slot, dtype, pad=0):
    """A state cache whose slots are contiguous but spaced ``pad`` elements apart, as vLLM's
    views into a shared buffer can be."""
    n = int(torch.tensor(per_slot).prod())
    flat = torch.randn(num_slots, n + pad, device=device).to(dtype)
    return flat[:, :n].view(num_slots, *per_slot)


def as_table_column(slots):
    """The same slots as the first column of a block table of two columns (vLLM's prefill
    slots under speculative decoding): a strided view whose neighbours are other slots."""
    num_slots = 9
    return torch.stack([slots, (slots + 1) % num_slots], dim=1)[:, 0]


def shapes(device):
    # (heads, head_dim, d_state): head_dim 80 and d_state 16 / 256 on CPU; the real shapes on GPU
    return [(3, 80, 16), (2, 8, 256)] if device == "cpu" else [(128, 64, 128), (128, 80, 128)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", STATE_DTYPES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_gather_matches_reference(device, dtype, slot_dtype):
    for per_slot in shapes(device):
        state = state_cache(device, 9, per_slot, dtype, pad=24)
        slots = torch.randperm(9, device=device)[:5].to(slot_dtype)
        has_initial = torch.tensor([True, False, True, True, False], device=device)
        for flags in (has_initial, None):
            for rows in (slots, as_table_column(slots)):
                got = gather_state_slots(state, rows, flags)
                assert got.is_contiguous()
                assert torch.equal(got, gather_state_slots_reference(state, slots, flags))
        # rows without an initial state are zeros, the others their slot's state exactly
        got = gather_state_slots(state, slots, has_initial)
        assert (got[~has_initial] == 0).all()
        assert torch.equal(got[has_initial], state[slots[has_initial].long()])


def int8_state_cache(device, num_slots, per_slot, pad=0):
    """An int8 state cache (slots spaced ``pad`` apart) and its fp32 scales, one per d_state
    row, some rows zero (scale 0) and some scales huge."""
    q = state_cache(device, num_slots, per_slot, torch.int8, pad)
    q.copy_(torch.randint(-127, 128, q.shape, device=device))
    scale = torch.rand(num_slots, *per_slot[:-1], device=device)
    scale[0, 0], q[0, 0] = 0.0, 0
    scale[-1, -1] = 2e36  # a row whose max is near fp32's largest value
    return q, scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_int8_gather_dequantizes_in_the_same_pass(device, slot_dtype):
    """With an int8 state's scales the gather returns fp32 values, each int8 element times
    its row's scale exactly as the reference (and the CPU path's dequantize) computes it;
    rows without an initial state stay zeros."""
    for per_slot in shapes(device):
        q, scale = int8_state_cache(device, 9, per_slot, pad=40)
        slots = torch.tensor([0, 3, 8, 5, 1], device=device).to(slot_dtype)
        has_initial = torch.tensor([True, False, True, True, False], device=device)
        for flags in (has_initial, None):
            for rows in (slots, as_table_column(slots)):
                got = gather_state_slots(q, rows, flags, scale)
                assert got.dtype == torch.float32 and got.is_contiguous()
                assert torch.equal(got, gather_state_slots_reference(q, slots, flags, scale))
        got = gather_state_slots(q, slots, has_initial, scale)
        assert (got[~has_initial] == 0).all()
        kept = slots[has_initial].long()
        assert torch.equal(got[has_initial], dequantize(q[kept], scale[kept]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", STATE_DTYPES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_scatter_matches_reference(device, dtype, slot_dtype):
    for per_slot in shapes(device):
        slots = torch.randperm(9, device=device)[:4].to(slot_dtype)
        values = torch.randn(4, *per_slot, device=device).to(dtype)
        for rows in (slots, as_table_column(slots)):
            state = state_cache(device, 9, per_slot, dtype, pad=24)
            # poisoned targets: every element of the written slots must come from values
            state[slots.long()] = poisoned(values)
            expected = state.clone()
            scatter_state_slots_reference(expected, slots, values)
            scatter_state_slots(state, rows, values)
            assert torch.equal(state, expected)  # the other slots untouched, bit for bit


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows(device):
    state = state_cache(device, 3, (2, 4, 16), torch.float32)
    slots = torch.empty(0, dtype=torch.int32, device=device)
    assert gather_state_slots(state, slots).shape == (0, 2, 4, 16)
    before = state.clone()
    scatter_state_slots(state, slots, torch.empty(0, 2, 4, 16, device=device))
    assert torch.equal(state, before)


def test_bad_arguments_raise():
    state = torch.zeros(4, 2, 8, 16)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="slots must have dtype"):
        gather_state_slots(state, slots.float())
    with pytest.raises(ValueError, match="has_initial must have shape"):
        gather_state_slots(state, slots, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="has_initial must have dtype"):
        gather_state_slots(state, slots, torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="each slot contiguous"):
        gather_state_slots(state.transpose(1, 2), slots)
    with pytest.raises(ValueError, match="values must have shape"):
        scatter_state_slots(state, slots, torch.zeros(2, 2, 8, 8))
    with pytest.raises(ValueError, match="values must have state's dtype"):
        scatter_state_slots(state, slots, torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="each row contiguous"):
        scatter_state_slots(state, slots, torch.zeros(2, 2, 16, 8).transpose(-1, -2))
    q, scale = state.to(torch.int8), torch.ones(4, 2, 8)
    with pytest.raises(ValueError, match="int8 state only, got state dtype torch.float32"):
        gather_state_slots(state, slots, None, scale)
    with pytest.raises(ValueError, match=r"scale must have shape \(4, 2, 8\)"):
        gather_state_slots(q, slots, None, torch.ones(4, 2, 16))
    with pytest.raises(ValueError, match="scale must have dtype"):
        gather_state_slots(q, slots, None, scale.bfloat16())
    with pytest.raises(ValueError, match="scale must have each slot contiguous"):
        gather_state_slots(q, slots, None, torch.ones(4, 8, 2).transpose(1, 2))


@pytest.mark.parametrize("dtype", STATE_DTYPES)
def test_cpu_paths_match_reference(dtype):
    """The CPU serving paths against the literal references."""
    state = state_cache("cpu", 9, (3, 80, 16), dtype, pad=24)
    slots = torch.tensor([4, 0, 7])
    has_initial = torch.tensor([True, False, True])
    got = gather_state_slots_cpu(state, slots, has_initial)
    assert torch.equal(got, gather_state_slots_reference(state, slots, has_initial))
    q, scale = int8_state_cache("cpu", 9, (3, 80, 16), pad=24)
    got = gather_state_slots_cpu(q, slots, has_initial, scale)
    assert torch.equal(got, gather_state_slots_reference(q, slots, has_initial, scale))
    values = torch.randn(3, 3, 80, 16).to(dtype)
    expected = state.clone()
    scatter_state_slots_reference(expected, slots, values)
    scatter_state_slots_cpu(state, slots, values)
    assert torch.equal(state, expected)
