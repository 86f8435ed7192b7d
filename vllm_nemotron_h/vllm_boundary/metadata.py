"""vLLM's Mamba2 attention backend, its metadata and builder: the per-step view of which
sequence owns which state slot."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.attention.backends.mamba2_attn import (
    Mamba2AttentionBackend,
    Mamba2AttentionMetadata,
    Mamba2AttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID  # 0 in both: vLLM's null block

from vllm_nemotron_h.vllm_boundary.config import mamba_cache_mode, speculative_tokens

__all__ = [
    "NULL_BLOCK_ID",
    "PlaceholderPrefills",
    "Mamba2AttentionBackend",
    "Mamba2AttentionMetadata",
    "Mamba2MetadataBuilder",
    "PromptRows",
    "accepted_counts_every_step",
    "decode_slots",
    "max_num_seqs",
    "prompt_rows_as_decodes",
]


class Mamba2MetadataBuilder(Mamba2AttentionMetadataBuilder):
    """vLLM's Mamba2 metadata builder with one hook, ``complete(metadata)``, run on every
    metadata vLLM hands to the layers: the one it builds, and the copies it makes for other
    KV-cache groups of the same spec with their own block table (``update_block_table``).

    A prompt of one token (or a first prompt chunk of one token) runs as a decode row from a
    zeroed slot: vLLM dispatches its CUDA graphs by shape, so a step whose rows all have one
    token replays the decode graph even when one row is a prompt's first token, which vLLM's
    metadata calls a prefill (the graph would then read the row's slot through a stale
    index). So does any prompt chunk of a decode row's tokens (1, or 1 + K under speculative
    decoding with K drafts): it runs as a decode row from the state the previous chunk left
    in its slot, or from a zeroed slot if it starts the prompt; under speculative decoding
    the state after each of its tokens is kept, and the next step must read the one after
    its last token, where vLLM counts one accepted token as after a prefill. vLLM 0.32
    schedules a prompt's first token with placeholder drafts (a row of 1 + drafts tokens, to
    keep its decode graph uniform): that row too runs as a decode, whose state after each
    token is kept and rolled back by the next step's accepted count (one), where a prefill
    would keep the state after the placeholders. The metadata's ``prompt_rows_d`` (the
    metadata class declares it) names those decode rows; before the step runs, ``complete``
    must zero the slots of those that start their prompt and, under speculative decoding,
    count one accepted token for those and all of a row's tokens at the row's next step.
    Such a placeholder row that the split leaves among the prefills (a prefill of a few
    tokens before it) stays a prefill; ``placeholder_prefills`` names it, and the prefill
    must then keep the state after the prompt token alone.

    vLLM 0.26 passes the accepted counts (``num_accepted_tokens``) only to steps in which some
    row verifies drafts; ``query_start_rows`` (every row's first token, set here) lets
    ``complete`` count them itself for the other steps (vLLM 0.32 passes them every step:
    ``accepted_counts_every_step``).

    Under speculative decoding vLLM's Mamba builder turns ``update_block_table`` off, so
    every Mamba cache group's metadata is built anew on the host in every step (Nemotron-H
    has a group per few Mamba layers). Outside Mamba cache mode 'all', whose decode block
    indices are each builder's own state, the group's block table decides only the slots,
    which ``update_block_table`` takes from it (1 + K of them a row under speculation); the
    token starts and accepted counts are the step's. So the builder keeps it on there
    (``copies_across_groups``): vLLM builds the first group's metadata and copies it for the
    others."""

    def __init__(
        self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        if copies_across_groups(self.use_spec_decode, mamba_cache_mode(vllm_config)):
            self.supports_update_block_table = True

    # The metadata's fields made once per step (in build, or at complete's first call), which
    # the copies for the other groups share: carried into each copy by name, whatever vLLM's
    # update_block_table copies.
    step_fields: tuple[str, ...] = ("prompt_rows_d", "placeholder_prefills", "query_start_rows")

    def complete(self, metadata: Mamba2AttentionMetadata) -> Mamba2AttentionMetadata:
        return metadata

    @property
    def decode_query_len(self) -> int:
        """Tokens of a row of the decode CUDA graphs: 1 + the draft tokens."""
        return 1 + speculative_tokens(self.vllm_config)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        **kwargs: Any,
    ) -> Mamba2AttentionMetadata:
        common_attn_metadata, prompt_rows = prompt_rows_as_decodes(
            common_attn_metadata, self.decode_query_len, kwargs.get("num_decode_draft_tokens_cpu")
        )
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        metadata.placeholder_prefills = None
        if prompt_rows is not None:  # rows past the decode rows stay prefills
            metadata.placeholder_prefills = PlaceholderPrefills.of(
                common_attn_metadata, prompt_rows.past(metadata.num_decodes), metadata
            )
            prompt_rows = prompt_rows.before(metadata.num_decodes)
        metadata.prompt_rows_d = prompt_rows
        # every row's first token (vLLM's runner buffer, on the device): the builder follows
        # each sequence's progress from it under speculative decoding
        metadata.query_start_rows = common_attn_metadata.query_start_loc
        return self.complete(metadata)

    def update_block_table(
        self, metadata: Mamba2AttentionMetadata, blk_table: torch.Tensor, slot_mapping: torch.Tensor
    ) -> Mamba2AttentionMetadata:
        updated = super().update_block_table(metadata, blk_table, slot_mapping)
        for name in self.step_fields:
            setattr(updated, name, getattr(metadata, name))
        return self.complete(updated)


def copies_across_groups(speculative: bool, cache_mode: str) -> bool:
    """Whether a Mamba cache group's metadata is copied from the step's first group with
    ``update_block_table`` where vLLM's builder would build it anew: under speculative
    decoding, outside mode 'all' (elsewhere vLLM's builder copies them itself, or must not)."""
    return speculative and cache_mode != "all"


@dataclass
class PlaceholderPrefills:
    """Prefill rows made of a prompt's one token and vLLM 0.32's placeholder drafts (rows the
    split left behind a prefill, so they could not run as decodes): the prefill must keep
    the state after the prompt token alone. Indices relative to the step's prefill rows and
    tokens, on the metadata's device."""

    rows: torch.Tensor  # the rows among the prefill rows
    tokens: torch.Tensor  # each row's prompt token
    placeholders: torch.Tensor  # every placeholder token of the rows

    @classmethod
    def of(cls, common_attn_metadata: Any, rows: torch.Tensor, metadata: Any):
        """Those of ``rows`` (batch rows, CPU) that hold placeholders, or None."""
        starts = common_attn_metadata.query_start_loc_cpu
        lens = starts[rows + 1] - starts[rows]
        rows = rows[lens > 1]
        if not len(rows):
            return None
        first = starts[rows] - metadata.num_decode_tokens
        placeholders = torch.cat(
            [torch.arange(int(f) + 1, int(f) + int(n)) for f, n in zip(first, lens[lens > 1])]
        )
        device = metadata.state_indices_tensor_p.device
        return cls(
            (rows - metadata.num_decodes).to(device), first.to(device), placeholders.to(device)
        )


@dataclass
class PromptRows:
    """Prompt rows that run as decode rows (batch rows, CPU int64, ascending), their tokens,
    and which of them start their prompt (``new``: no state before them) and which hold vLLM
    0.32's placeholder drafts after their one prompt token (``placeholders``), as bool
    masks."""

    rows: torch.Tensor
    tokens: torch.Tensor
    new: torch.Tensor
    placeholders: torch.Tensor

    def before(self, num_decodes: int) -> PromptRows | None:
        """Those among the first ``num_decodes`` rows (the split's decode rows), or None."""
        keep = self.rows < num_decodes
        if not bool(keep.any()):
            return None
        return PromptRows(
            self.rows[keep], self.tokens[keep], self.new[keep], self.placeholders[keep]
        )

    def kept_whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of several prompt tokens (no placeholders), all of them kept, and their
        token counts."""
        whole = ~self.placeholders & (self.tokens > 1)
        return self.rows[whole], self.tokens[whole]

    def past(self, num_decodes: int) -> torch.Tensor:
        """The placeholder rows the split left among the prefills."""
        return self.rows[(self.rows >= num_decodes) & self.placeholders]


def prompt_rows_as_decodes(
    common_attn_metadata: Any, decode_query_len: int = 1, draft_tokens: torch.Tensor | None = None
) -> tuple[Any, PromptRows | None]:
    """``common_attn_metadata`` with the prompt rows that must run as decode rows no longer
    marked prefilling (vLLM's split then counts them as decodes: its reordering puts rows of
    up to ``decode_query_len`` tokens before longer ones), and those rows, or None: a
    prompt's first and only scheduled token (with placeholder drafts where
    ``draft_tokens``, vLLM 0.32's per-row draft counts of decode transactions, -1 elsewhere,
    say so), and any prompt chunk of ``decode_query_len`` tokens (a row of the decode CUDA
    graphs' shape)."""
    is_prefilling = common_attn_metadata.is_prefilling  # CPU, as vLLM's split reads it
    seq_lens = common_attn_metadata.seq_lens_cpu_upper_bound
    # a step of decodes alone (most steps) pays one op here: this runs on the host every step
    if is_prefilling is None or seq_lens is None or not bool(is_prefilling.any()):
        return common_attn_metadata, None
    query_lens = torch.diff(common_attn_metadata.query_start_loc_cpu)
    new = seq_lens == query_lens
    placeholders = torch.zeros_like(is_prefilling)
    if draft_tokens is not None:
        drafts = draft_tokens[: len(query_lens)]
        placeholders = new & (drafts > 0) & (query_lens == drafts + 1)
    as_decode = is_prefilling & (
        (query_lens == decode_query_len) | (new & (query_lens == 1)) | placeholders
    )
    if not bool(as_decode.any()):
        return common_attn_metadata, None
    rows = as_decode.nonzero().flatten()
    marked = common_attn_metadata.replace(is_prefilling=is_prefilling & ~as_decode)
    return marked, PromptRows(rows, query_lens[rows], new[rows], placeholders[rows])


# How vLLM's model runner (``execute_model``) decides in which steps the Mamba builders get the
# accepted counts: in every step of an engine with speculation (vLLM 0.32), or only in steps
# in which some row verifies drafts (vLLM 0.26).
COUNTS_EVERY_STEP = "use_spec_decode = self.speculative_config is not None"
COUNTS_WITH_DRAFTS = "use_spec_decode = len(scheduler_output.scheduled_spec_decode_tokens) > 0"


@functools.cache
def accepted_counts_every_step() -> bool:
    """Whether vLLM hands the Mamba builders the accepted counts (``num_accepted_tokens``)
    in every step of an engine with speculation, so that the builder need not count them
    for steps without drafts. Read from the model runner's source; a runner that says
    neither, or whose source is not installed, is counted for."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    try:
        return COUNTS_EVERY_STEP in inspect.getsource(GPUModelRunner.execute_model)
    except (OSError, TypeError):  # compiled-only install: no source to read
        return False


def decode_slots(metadata: Mamba2AttentionMetadata) -> torch.Tensor:
    """The decode rows' state slots (int32, the first block of each row's block table)."""
    return metadata.state_indices_tensor_d[:, 0]


def max_num_seqs(vllm_config: Any) -> int:
    return vllm_config.scheduler_config.max_num_seqs
