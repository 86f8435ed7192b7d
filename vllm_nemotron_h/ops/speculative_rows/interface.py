"""A speculative step's decode rows in the state cache manager's int64 buffers, and the
accepted counts where vLLM gives none (model_executor/state_slots.py's builder runs it once
per KV-cache group and step).

``speculative_rows(rows, out, count=None)``, with ``n = rows.rows`` decode rows and
``K = rows.max_tokens``::

    out.state_slots[r, c] = rows.slot_table[r, c]                  r < n, c < K
    out.query_start[r]    = rows.query_start[r], or r where vLLM gives none      r <= n
    out.num_accepted[r]   = rows.num_accepted[r]; where vLLM gives none, the counted count
                            (rows < count.num_decodes), else 1                  r < n

``count`` (vLLM 0.26 gives no accepted counts in a step without drafts): decode row r's count
is its tokens computed before this step (``seq_lens[r]`` less its tokens in the step) less
``tokens_before`` at its slot (its first, ``slot_table[r, 0]``), clamped to 1..K: the
scheduler moves a sequence on by the tokens the sampler accepted. Then every row of the step
records its own: a decode row its tokens computed before this step, a prefill row (slot
``prefill_slots[r - num_decodes]``) its last token (all of a prefill's tokens are kept: the
next step counts one). The record is made in steps with counts given too, and in steps of
prefills alone (n = 0). Sequences own distinct slots.

Why a kernel: the builder's work runs on the host before every step's forward, in every
Mamba cache group (8 on Nemotron-H 8B). Where the builder counts (vLLM 0.26's steps without
drafts) the same in PyTorch is ~15 small launches a group, several times the host time of
the one launch; where vLLM gives the counts the launch costs about what the three copies it
replaces did (benchmarks/NOTES.md).
"""

from __future__ import annotations

import torch

from vllm_nemotron_h.ops.speculative_rows import kernel
from vllm_nemotron_h.ops.speculative_rows.args import AcceptedCount, RowBuffers, StepRows
from vllm_nemotron_h.ops.speculative_rows.cpu import speculative_rows_cpu
from vllm_nemotron_h.ops.support import check_tensor, use_triton

INDEX_DTYPES = (torch.int32, torch.int64)


def check(rows: StepRows, out: RowBuffers, count: AcceptedCount | None = None) -> None:
    """Raises ValueError naming the first argument that does not fit."""
    table = rows.slot_table
    check_tensor("slot_table", table, (None, None), INDEX_DTYPES)
    n, k, dev = rows.rows, rows.max_tokens, table.device
    if (rows.query_start is None) != (rows.num_accepted is None):
        raise ValueError("query_start and num_accepted must both be given or both be None")
    if rows.query_start is not None:
        check_tensor("query_start", rows.query_start, (n + 1,), INDEX_DTYPES, dev)
        check_tensor("num_accepted", rows.num_accepted, (n,), INDEX_DTYPES, dev)
    for name in ("state_slots", "query_start", "num_accepted"):
        buffer = getattr(out, name)
        check_tensor(f"out.{name}", buffer, None, (torch.int64,), dev)
        if not buffer.is_contiguous():
            raise ValueError(f"out.{name} must be contiguous, got strides {buffer.stride()}")
    m = out.max_rows
    check_tensor("out.state_slots", out.state_slots, (m, k))
    check_tensor("out.query_start", out.query_start, (m + 1,))
    check_tensor("out.num_accepted", out.num_accepted, (m,))
    if n > m:
        raise ValueError(f"slot_table has {n} rows, the buffers hold at most {m}")
    if count is None:
        return
    if not 0 <= count.num_decodes <= min(n, count.num_rows) or count.num_rows > m:
        raise ValueError(
            f"count must have 0 <= num_decodes <= min(rows, num_rows) and num_rows <= {m}, "
            f"got num_decodes={count.num_decodes}, num_rows={count.num_rows}, rows={n}"
        )
    check_tensor("count.tokens_before", count.tokens_before, (None,), (torch.int64,), dev)
    nr, np_ = count.num_rows, count.num_rows - count.num_decodes
    for name, tensor, least in (
        ("count.prefill_slots", count.prefill_slots, np_),
        ("count.seq_lens", count.seq_lens, nr),
        ("count.step_starts", count.step_starts, nr + 1),
    ):
        check_tensor(name, tensor, (None,), INDEX_DTYPES, dev)
        if tensor.shape[0] < least:
            raise ValueError(f"{name} must have at least {least} entries, got {tensor.shape[0]}")


def run(rows: StepRows, out: RowBuffers, count: AcceptedCount | None = None) -> None:
    """The kernel on a GPU (or under the Triton interpreter), else the CPU path; no checks."""
    if use_triton(rows.slot_table):
        kernel.launch(rows, out, count)
    else:
        speculative_rows_cpu(rows, out, count)


def speculative_rows(rows: StepRows, out: RowBuffers, count: AcceptedCount | None = None) -> None:
    """Fills ``out``'s first rows from ``rows`` (and counts with ``count``): see the module
    doc."""
    check(rows, out, count)
    run(rows, out, count)
