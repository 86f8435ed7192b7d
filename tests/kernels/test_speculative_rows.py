import pytest
import torch
from helpers import DEVICES

from vllm_nemotron_h.ops.speculative_rows import speculative_rows
from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows
from vllm_nemotron_h.ops.speculative_rows.cpu import speculative_rows_cpu
from vllm_nemotron_h.ops.speculative_rows.reference import speculative_rows_reference

MAX_ROWS, K, NUM_SLOTS = 6, 4, 32
IMPLEMENTATIONS = {"op": speculative_rows, "cpu": speculative_rows_cpu}


def buffers(device) -> RowBuffers:
    """Buffers holding a sentinel, so that what the op leaves alone shows."""
    return RowBuffers(
        torch.full((MAX_ROWS, K), -7, dtype=torch.int64, device=device),
        torch.full((MAX_ROWS + 1,), -7, dtype=torch.int64, device=device),
        torch.full((MAX_ROWS,), -7, dtype=torch.int64, device=device),
    )


def slot_table(device, rows: int, dtype=torch.int32) -> torch.Tensor:
    """Distinct slots as vLLM lays them out: a column block of a wider block table (strided)."""
    slots = torch.randperm(NUM_SLOTS, device=device)[: rows * K].view(rows, K).to(dtype)
    return torch.cat([slots, slots[:, :1]], dim=1)[:, :K]


def run(impl, rows, count, device):
    out = buffers(device)
    impl(rows, out, count)
    return out


def on_cpu(rows: StepRows) -> StepRows:
    """The same rows on the CPU, for the reference."""
    fields = (rows.slot_table, rows.query_start, rows.num_accepted)
    return StepRows(*(None if t is None else t.cpu() for t in fields))


def assert_same(a: RowBuffers, b: RowBuffers) -> None:
    for name in ("state_slots", "query_start", "num_accepted"):
        assert getattr(a, name).cpu().tolist() == getattr(b, name).cpu().tolist(), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=str)
@pytest.mark.parametrize("given", [True, False], ids=["counts-given", "one-token-rows"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_rows_match_reference(device, impl, given, index_dtype):
    for n in (0, 1, 3, MAX_ROWS):
        table = slot_table(device, n, index_dtype)
        starts = accepted = None
        if given:
            lens = torch.randint(1, K + 1, (n,), device=device)
            starts = torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(index_dtype)
            accepted = torch.randint(1, K + 1, (n,), device=device).to(index_dtype)
        rows = StepRows(table, starts, accepted)
        expected = buffers("cpu")
        speculative_rows_reference(on_cpu(rows), expected)
        got = run(IMPLEMENTATIONS[impl], rows, None, device)
        assert_same(got, expected)
        # rows past the step's are left as they were
        assert (got.state_slots[n:] == -7).all() and (got.num_accepted[n:] == -7).all()


def step(device, impl, before, decodes, prefills, given=None):
    """One step of the builder: ``decodes`` and ``prefills`` are lists of (slot, seq_len,
    tokens in the step); returns the decode rows' accepted counts and checks the op against
    the reference on copies of the record."""
    n = len(decodes) + len(prefills)
    table = torch.tensor([[s] + [NUM_SLOTS - 1 - i] * (K - 1) for i, (s, _, _) in
                          enumerate(decodes)], dtype=torch.int32).view(-1, K)  # fmt: skip
    prefill_slots = torch.tensor([s for s, _, _ in prefills], dtype=torch.int32)
    rows_all = decodes + prefills
    seq_lens = torch.tensor([q for _, q, _ in rows_all], dtype=torch.int32)
    step_starts = torch.tensor([0] + [t for _, _, t in rows_all]).cumsum(0).to(torch.int32)

    def count_with(record, dev):
        return AcceptedCount(
            record, prefill_slots.to(dev), seq_lens.to(dev), step_starts.to(dev), len(decodes), n
        )

    rows = StepRows(table.to(device))
    if given is not None:
        starts = step_starts[: len(decodes) + 1]
        rows = StepRows(table.to(device), starts.to(device), torch.tensor(given).to(device))
    reference_before = before.cpu().clone()
    expected = buffers("cpu")
    speculative_rows_reference(on_cpu(rows), expected, count_with(reference_before, "cpu"))
    got = run(IMPLEMENTATIONS[impl], rows, count_with(before, device), device)
    assert_same(got, expected)
    assert before.cpu().tolist() == reference_before.tolist()
    return got.num_accepted[: len(decodes)].tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=str)
def test_accepted_counts_follow_each_sequences_progress(device, impl):
    """Where vLLM gives no accepted counts (vLLM 0.26 in a step without drafts) the builder
    counts them: the tokens a sequence had computed before this step less those before its
    previous step, kept by slot."""
    before = torch.zeros(NUM_SLOTS, dtype=torch.int64, device=device)
    assert step(device, impl, before, [], [(3, 10, 10), (5, 4, 4)]) == []  # two prompts
    # slot 3 verifies 3 drafts (vLLM gives last step's count, 1); slot 5 ends its prompt
    assert step(device, impl, before, [(3, 14, 4)], [(5, 8, 4)], given=[1]) == [1]
    # 2 of slot 3's drafts were accepted (the scheduler moved it on by 3 tokens); no drafts
    assert step(device, impl, before, [(3, 14, 1), (5, 9, 1)], []) == [3, 1]
    assert step(device, impl, before, [(5, 10, 1), (3, 15, 1)], []) == [1, 1]
    # slot 3's next owner: a prompt, then its first decode
    assert step(device, impl, before, [], [(3, 6, 6)]) == []
    assert step(device, impl, before, [(3, 7, 1)], []) == [1]
    # a count is at most K (1 + drafts)
    step(device, impl, before, [(3, 11, 4)], [])
    assert step(device, impl, before, [(3, 30, 1)], []) == [K]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_name_what_is_wrong(device):
    table = slot_table(device, 2)
    with pytest.raises(ValueError, match="both be given"):
        speculative_rows(StepRows(table, torch.zeros(3, dtype=torch.int32, device=device)),
                         buffers(device))  # fmt: skip
    with pytest.raises(ValueError, match="slot_table must have dtype"):
        speculative_rows(StepRows(table.float()), buffers(device))
    with pytest.raises(ValueError, match="at most 6"):
        speculative_rows(StepRows(slot_table(device, 1).repeat(7, 1)), buffers(device))
    out = buffers(device)
    out.num_accepted = out.num_accepted.int()
    with pytest.raises(ValueError, match="out.num_accepted must have dtype"):
        speculative_rows(StepRows(table), out)
