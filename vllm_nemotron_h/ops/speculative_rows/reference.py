"""ops/speculative_rows written literally, one row at a time (the test oracle; production
never calls it)."""

from __future__ import annotations

from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows


def speculative_rows_reference(
    rows: StepRows, out: RowBuffers, count: AcceptedCount | None = None
) -> None:
    """Same arguments and effects as ``speculative_rows`` (see interface.py)."""
    n, k = rows.rows, rows.max_tokens
    for r in range(n):
        for c in range(k):
            out.state_slots[r, c] = int(rows.slot_table[r, c])
    for r in range(n + 1):
        out.query_start[r] = r if rows.query_start is None else int(rows.query_start[r])
    counted = [1] * n
    if count is not None:
        before = count.tokens_before
        recorded = []
        for r in range(count.num_rows):
            seq_len = int(count.seq_lens[r])
            computed = seq_len - int(count.step_starts[r + 1]) + int(count.step_starts[r])
            if r < count.num_decodes:
                slot = int(rows.slot_table[r, 0])
                counted[r] = min(max(computed - int(before[slot]), 1), k)
                recorded.append((slot, computed))
            else:
                recorded.append((int(count.prefill_slots[r - count.num_decodes]), seq_len - 1))
        for slot, tokens in recorded:
            before[slot] = tokens
    for r in range(n):
        given = rows.num_accepted
        out.num_accepted[r] = counted[r] if given is None else int(given[r])
