"""The CPU serving path of ops/speculative_rows: PyTorch copies and indexing."""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows


def speculative_rows_cpu(rows: StepRows, out: RowBuffers, count: AcceptedCount | None) -> None:
    """Same arguments and effects as the interface's ``speculative_rows``; no checks."""
    n = rows.rows
    out.state_slots[:n].copy_(rows.slot_table)
    if rows.query_start is None:
        torch.arange(n + 1, out=out.query_start[: n + 1])
    else:
        out.query_start[: n + 1].copy_(rows.query_start[: n + 1])
    counted = accepted_since_last_step(rows, count) if count is not None else None
    if rows.num_accepted is not None:
        out.num_accepted[:n].copy_(rows.num_accepted[:n])
        return
    out.num_accepted[:n].fill_(1)
    if counted is not None:
        out.num_accepted[: counted.shape[0]].copy_(counted)


def accepted_since_last_step(rows: StepRows, count: AcceptedCount) -> torch.Tensor:
    """The decode rows' accepted counts at their previous step: the tokens computed before
    this step less ``tokens_before[slot]`` (recorded at that step), in 1..K. Then records
    this step's rows: a decode row's tokens computed before this step (the sampler will
    accept 1..q of its q tokens), a prefill row's last token (all of its tokens are kept:
    the next step counts one)."""
    nd, n = count.num_decodes, count.num_rows
    slots = torch.cat([rows.slot_table[:nd, 0], count.prefill_slots[: n - nd]]).long()
    seq_lens = count.seq_lens[:n].long()
    computed = seq_lens - torch.diff(count.step_starts[: n + 1]).long()
    before = count.tokens_before
    counted = (computed[:nd] - before[slots[:nd]]).clamp(1, rows.max_tokens)
    before.index_copy_(0, slots, torch.cat([computed[:nd], seq_lens[nd:] - 1]))
    return counted
