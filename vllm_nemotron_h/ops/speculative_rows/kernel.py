"""The Triton kernel of ops/speculative_rows and its launch (no checks): see interface.py.
One program over every row of the step: the builder's work of a speculative step in one
launch instead of a dozen small PyTorch ops per KV-cache group (each Mamba cache group builds
its own metadata every step under speculative decoding)."""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows


# The row counts vary every step: specializing on them (1, multiples of 16) would compile
# new variants mid-run.
@triton.jit(do_not_specialize=["rows", "num_decodes", "num_rows"])
def _speculative_rows_kernel(
    table_ptr, t_r, t_c, starts_ptr, accepted_ptr, slots_out_ptr, so_r, starts_out_ptr,
    accepted_out_ptr, before_ptr, prefill_slots_ptr, p_r, seq_lens_ptr, step_starts_ptr,
    rows, num_decodes, num_rows,
    K: tl.constexpr, BLOCK: tl.constexpr, GIVEN: tl.constexpr, COUNT: tl.constexpr,
):  # fmt: skip
    r = tl.arange(0, BLOCK)
    live = r < rows
    for c in tl.static_range(K):
        slot = tl.load(table_ptr + r * t_r + c * t_c, mask=live)
        tl.store(slots_out_ptr + r * so_r + c, slot.to(tl.int64), mask=live)
    starts = r.to(tl.int64)
    if GIVEN:
        starts = tl.load(starts_ptr + r, mask=r <= rows).to(tl.int64)
    tl.store(starts_out_ptr + r, starts, mask=r <= rows)
    accepted = tl.full((BLOCK,), 1, tl.int64)
    if COUNT:
        decode = r < num_decodes
        prefill = (r >= num_decodes) & (r < num_rows)
        slot = tl.where(
            decode,
            tl.load(table_ptr + r * t_r, mask=decode, other=0).to(tl.int64),
            tl.load(prefill_slots_ptr + (r - num_decodes) * p_r, mask=prefill, other=0).to(
                tl.int64
            ),
        )
        step_row = decode | prefill
        seq_len = tl.load(seq_lens_ptr + r, mask=step_row, other=0).to(tl.int64)
        first = tl.load(step_starts_ptr + r, mask=step_row, other=0).to(tl.int64)
        end = tl.load(step_starts_ptr + r + 1, mask=step_row, other=0).to(tl.int64)
        computed = seq_len - (end - first)
        # A row's slot is its own: each thread reads and writes only its rows' entries.
        before = tl.load(before_ptr + slot, mask=decode, other=0)
        accepted = tl.where(decode, tl.minimum(tl.maximum(computed - before, 1), K), accepted)
        tl.store(before_ptr + slot, tl.where(decode, computed, seq_len - 1), mask=step_row)
    if GIVEN:
        accepted = tl.load(accepted_ptr + r, mask=live, other=1).to(tl.int64)
    tl.store(accepted_out_ptr + r, accepted, mask=live)


def launch(rows: StepRows, out: RowBuffers, count: AcceptedCount | None) -> None:
    """One program of ``triton.next_power_of_2(out.max_rows + 1)`` rows (one compiled variant
    per builder); no checks (the interface checks, the builder trusts vLLM's metadata)."""
    table, given = rows.slot_table, rows.num_accepted is not None
    starts = rows.query_start if given else table
    accepted = rows.num_accepted if given else table
    if count is None:
        before, prefill_slots, seq_lens, step_starts = table, table, table, table
        num_decodes = num_rows = 0
    else:
        before, prefill_slots = count.tokens_before, count.prefill_slots
        seq_lens, step_starts = count.seq_lens, count.step_starts
        num_decodes, num_rows = count.num_decodes, count.num_rows
    _speculative_rows_kernel[(1,)](
        table, table.stride(0), table.stride(1), starts, accepted, out.state_slots,
        out.state_slots.stride(0), out.query_start, out.num_accepted, before, prefill_slots,
        prefill_slots.stride(0), seq_lens, step_starts, rows.rows, num_decodes, num_rows,
        K=rows.max_tokens, BLOCK=triton.next_power_of_2(out.max_rows + 1), GIVEN=given,
        COUNT=count is not None, num_warps=4,
    )  # fmt: skip
