"""The boundary with vLLM: each touchpoint's contract holds on the installed vLLM, no other
module of the plugin reaches into vLLM, and the plugin never imports the testing package."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import vllm

from vllm_nemotron_h.vllm_boundary import TESTED_VLLM, TOUCHPOINTS, Touchpoint

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_nemotron_h"
# Public API the plugin may use outside the boundary: the model registry (its entry point).
PUBLIC_VLLM = {"vllm"}


@pytest.mark.parametrize("touchpoint", TOUCHPOINTS, ids=lambda t: t.name)
def test_touchpoint_contract(touchpoint: Touchpoint):
    try:
        touchpoint.check()
    except Exception as err:  # noqa: BLE001 - any change in vLLM fails the touchpoint
        pytest.fail(
            f"vLLM {vllm.__version__} changed touchpoint {touchpoint.name!r} "
            f"({touchpoint.vllm}): {err}. Why the plugin needs it: {touchpoint.why}"
        )


def test_installed_vllm_is_a_tested_version():
    assert vllm.__version__.split("+")[0] in TESTED_VLLM


def test_only_the_boundary_imports_vllm():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name in ("vllm_boundary", "testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                if name.split(".")[0] == "vllm" and name not in PUBLIC_VLLM:
                    offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert not offenders, f"vLLM internals reached outside vllm_boundary/: {offenders}"


def test_plugin_never_imports_testing():
    code = (
        "import sys, vllm_nemotron_h.plugin as p, vllm_nemotron_h.model_executor.hybrid_model;"
        "p.register();"
        "print(sorted(m for m in sys.modules if m.startswith('vllm_nemotron_h.testing')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_prompt_rows_of_a_decode_rows_tokens_run_as_decodes():
    """Prompt rows a decode CUDA graph would take by shape run as decodes: a prompt's one
    token, the same with vLLM 0.32's placeholder drafts (a row of 1 + drafts tokens, no state
    before it), and under speculative decoding a prompt chunk of 1 + drafts tokens (a first
    chunk or a later one). Where the split leaves a placeholder row among the prefills, its
    placeholder tokens are named for the prefill to pass the state through."""
    from vllm_nemotron_h.vllm_boundary.metadata import PlaceholderPrefills, prompt_rows_as_decodes

    # Rows: a decode with 2 drafts, a 3-token prompt, a 1-token prompt with 2 placeholders,
    # a 1-token prompt, a second chunk of a prompt (state before it), a 3-token later chunk.
    query_start = torch.tensor([0, 3, 6, 9, 10, 14, 17])
    common = SimpleNamespace(
        is_prefilling=torch.tensor([False, True, True, True, True, True]),
        seq_lens_cpu_upper_bound=torch.tensor([40, 3, 3, 1, 20, 9]),
        query_start_loc_cpu=query_start,
        replace=lambda **kw: SimpleNamespace(**{**vars(common), **kw}),
    )
    drafts = torch.tensor([2, -1, 2, -1, -1, -1])
    marked, rows = prompt_rows_as_decodes(common, 3, drafts)
    assert rows.rows.tolist() == [1, 2, 3, 5] and rows.tokens.tolist() == [3, 3, 1, 3]
    assert rows.new.tolist() == [True, True, True, False]
    assert rows.placeholders.tolist() == [False, True, False, False]
    assert marked.is_prefilling.tolist() == [False, False, False, False, True, False]
    # without speculation: only the one-token prompt (a 3-token chunk is a prefill's)
    _, plain = prompt_rows_as_decodes(common)
    assert plain.rows.tolist() == [3] and plain.new.tolist() == [True]
    # a step of decodes alone comes back as it was
    decodes = SimpleNamespace(**{**vars(common), "is_prefilling": torch.zeros(6, dtype=bool)})
    marked_decodes, no_rows = prompt_rows_as_decodes(decodes, 3, drafts)
    assert marked_decodes is decodes and no_rows is None
    # The split stops after the 3-token prompt: rows 2..5 prefill.
    assert rows.before(2).rows.tolist() == [1]
    assert rows.past(2).tolist() == [2]
    metadata = SimpleNamespace(
        num_decodes=2, num_decode_tokens=6, state_indices_tensor_p=torch.tensor([5, 6, 7, 8])
    )
    found = PlaceholderPrefills.of(common, rows.past(2), metadata)
    assert found.rows.tolist() == [0]  # the prefill rows: row 2, 3, 4, 5
    assert found.tokens.tolist() == [0]  # prefill-relative: row 2 starts at token 6 - 6
    assert found.placeholders.tolist() == [1, 2]
    assert PlaceholderPrefills.of(common, torch.tensor([3]), metadata) is None


def test_the_builder_counts_accepted_tokens_only_where_vllm_gives_none():
    """vLLM 0.26 gives the Mamba builders accepted counts only in steps with drafts (the
    builder counts the others itself), vLLM 0.32 in every step of an engine with
    speculation (the builder does not count)."""
    from vllm_nemotron_h.vllm_boundary.metadata import accepted_counts_every_step

    expected = {"0.26.0": False, "0.32.0": True}[vllm.__version__.split("+")[0]]
    assert accepted_counts_every_step() is expected


@pytest.mark.parametrize(
    "speculative, cache_mode, copies",
    [(False, "none", True), (True, "none", True), (True, "align", True), (True, "all", False)],
)
def test_mamba_cache_groups_copy_the_first_groups_metadata(
    tiny_checkpoint, speculative, cache_mode, copies
):
    """vLLM's runner copies a Mamba cache group's metadata from the step's first group where
    the builder allows it (``supports_update_block_table``); vLLM's own builder refuses under
    speculative decoding, the plugin's allows it there outside mode 'all'."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import MambaSpec

    from vllm_nemotron_h.vllm_boundary.config import set_mamba_cache_mode
    from vllm_nemotron_h.vllm_boundary.metadata import (
        Mamba2AttentionMetadataBuilder,
        Mamba2MetadataBuilder,
    )

    drafts = 3 if speculative else 0
    vllm_config = EngineArgs(
        model=tiny_checkpoint("dense"),
        skip_tokenizer_init=True,
        max_model_len=256,
        enable_prefix_caching=False,
        speculative_config=dict(method="ngram", num_speculative_tokens=drafts) if drafts else None,
    ).create_engine_config()
    set_mamba_cache_mode(vllm_config, cache_mode)
    spec = MambaSpec(
        block_size=256,
        shapes=((3, 128), (4, 16, 16)),
        dtypes=(torch.float32, torch.float32),
        mamba_type="mamba2",
        num_speculative_blocks=drafts,
    )
    args = (spec, ["model.layers.0.mixer"], vllm_config, torch.device("cpu"))
    with set_current_vllm_config(vllm_config):
        vllms, plugins = Mamba2AttentionMetadataBuilder(*args), Mamba2MetadataBuilder(*args)
    assert vllms.supports_update_block_table is not speculative
    assert plugins.supports_update_block_table is copies


class RecordingAutotuner:
    """Stands in for a Triton Autotuner: records the launches through it and through its
    kernel, and picks a config at each launch through it, as the autotuner does."""

    def __init__(self) -> None:
        self.tuned, self.launched = [], []
        self.fn = SimpleNamespace(run=lambda *a, **kw: self.launched.append((a, kw)))

    def __getitem__(self, grid):
        def tune(*args, **kwargs):
            self.tuned.append((grid, args, kwargs))
            self.best_config = SimpleNamespace(all_kwargs=lambda: {"BLOCK": 64, "num_warps": 4})

        return tune


def test_a_tuned_launch_goes_through_the_autotuner_once_then_with_its_choice():
    from vllm_nemotron_h.vllm_boundary.prefill import TunedLaunch

    autotuner = RecordingAutotuner()
    launch = TunedLaunch(autotuner)
    launch[(3, 1)](x_ptr="x", n=5)
    assert autotuner.tuned == [((3, 1), (), {"x_ptr": "x", "n": 5})] and not autotuner.launched
    launch[(4, 2)](x_ptr="y", n=6)
    launch[(5, 2)]("z", n=7)
    assert len(autotuner.tuned) == 1
    assert autotuner.launched == [
        ((), {"x_ptr": "y", "n": 6, "grid": (4, 2), "warmup": False, "BLOCK": 64, "num_warps": 4}),
        (("z",), {"n": 7, "grid": (5, 2), "warmup": False, "BLOCK": 64, "num_warps": 4}),
    ]


def test_tuned_scan_kernels_stand_in_for_vllms_only_while_entered():
    """Inside, each of vLLM's scan kernels is a stand-in for it, one set per signature and
    kept across entries; after leaving, also by an error, vLLM's module globals are its own."""
    from vllm_nemotron_h.vllm_boundary.prefill import SCAN_KERNELS, TunedScanKernels

    vllms = [getattr(module, name) for module, name in SCAN_KERNELS]
    signature = ("test", len(vllms))
    tuned = TunedScanKernels(signature)
    with pytest.raises(RuntimeError, match="scan failed"), tuned:
        inside = [getattr(module, name) for module, name in SCAN_KERNELS]
        raise RuntimeError("scan failed")
    assert [launch.autotuner for launch in inside] == vllms
    assert not any(a is b for a, b in zip(inside, vllms))
    assert [getattr(module, name) for module, name in SCAN_KERNELS] == vllms
    assert TunedScanKernels(signature).launches is tuned.launches
    assert TunedScanKernels((*signature, "other")).launches is not tuned.launches


def small_scan_weights(device: str = "cpu"):
    """A small layer's scan parameters: 24 heads of 32, 2 groups, d_state 64."""
    from vllm_nemotron_h.vllm_boundary.prefill import ScanWeights

    heads = 24
    D, dt_bias = torch.randn(2, heads, device=device)
    return ScanWeights(-torch.rand(heads, device=device) - 0.5, D, dt_bias, heads, 32, 2, 64, 3)


def record_autotuner_runs(monkeypatch) -> list:
    """The scan autotuners (Triton's Autotuner) run from now on, each appended as it runs."""
    from vllm_nemotron_h.vllm_boundary import prefill

    autotuner_class = type(getattr(*prefill.SCAN_KERNELS[0]))
    runs = []
    run = autotuner_class.run
    monkeypatch.setattr(
        autotuner_class, "run", lambda self, *a, **kw: runs.append(self) or run(self, *a, **kw)
    )
    return runs


def test_scan_tuning_inputs_are_one_chunk_sequences_as_vllms_metadata_cuts_them():
    from vllm_nemotron_h.testing.op_inputs import prefill_chunks
    from vllm_nemotron_h.vllm_boundary.prefill import tuning_inputs

    w = small_scan_weights()
    given = tuning_inputs(w, 16, 5, torch.bfloat16, torch.float32, torch.device("cpu"))
    md = prefill_chunks([16] * 5, 16, "cpu")
    assert torch.equal(given.cu_seqlens, md.query_start_loc_p)
    wants = (md.seq_idx_p, md.cu_chunk_seqlen_p, md.last_chunk_indices_p)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(given.chunks, wants))
    assert given.md.chunk_size == 16
    assert given.x.shape == given.out.shape == (80, 24 * 32) and given.x.dtype == torch.bfloat16
    assert given.B.shape == given.C.shape == (80, 2 * 64) and given.dt.shape == (80, 24)
    # as a layer's prefill lays them out: views of the conv's and the projection's rows
    conv_width = 24 * 32 + 2 * 2 * 64
    assert given.x.stride() == given.B.stride() == given.C.stride() == (conv_width, 1)
    assert given.dt.stride() == (24 * 32 + conv_width + 24, 1)
    assert given.B.data_ptr() - given.x.data_ptr() == 24 * 32 * given.x.element_size()
    assert given.initial_states.shape == (5, 24, 32, 64)
    assert given.initial_states.dtype == torch.float32


def test_tune_scan_tunes_each_untuned_signature_once_at_up_to_32_chunks(monkeypatch):
    """On a GPU the scan runs once per signature not yet tuned, with and without initial
    states, at 32 one-chunk sequences or the chunks the profile run's tokens hold (at least
    one), in the plugin's Triton cache directory for that count; a failing scan is logged,
    not raised; on a CPU nothing runs."""
    from triton import knobs

    from vllm_nemotron_h.vllm_boundary import prefill

    made, scanned, warnings, infos, cache_dirs = [], [], [], [], []
    tuning_inputs = prefill.tuning_inputs
    triton_cache = knobs.cache.dir

    def inputs(w, chunk_size, sequences, act_dtype, state_dtype, device):
        made.append(sequences)
        return tuning_inputs(w, chunk_size, sequences, act_dtype, state_dtype, "cpu")

    def scan(md, w, x, B, C, dt, out, initial_states, state_dtype, per_chunk, cu, chunks):
        given = initial_states is not None
        scanned.append((x.shape[0], given, per_chunk))
        cache_dirs.append(knobs.cache.dir)
        signature = prefill.scan_signature(md.chunk_size, w, x.dtype, dt.dtype, state_dtype, given)
        if state_dtype == torch.float16:
            raise RuntimeError("out of resources")
        for launch in prefill.TunedScanKernels(signature).launches:
            launch.config = {"BLOCK_SIZE": 64}

    monkeypatch.setattr(prefill, "tuning_inputs", inputs)
    monkeypatch.setattr(prefill, "_scan", scan)
    monkeypatch.setattr(prefill.TunedScanKernels, "_launches", {})
    monkeypatch.setattr(
        prefill,
        "plugin_logger",
        lambda: SimpleNamespace(
            warning=lambda *a, **k: warnings.append(a), info=lambda *a, **k: infos.append(a)
        ),
    )
    w, gpu = small_scan_weights(), torch.device("cuda")
    prefill.tune_scan(w, 16, 16 * 100, torch.bfloat16, torch.float32, gpu)
    assert made == [32] and scanned == [(512, False, False), (512, True, False)]
    own = os.path.join(triton_cache, "vllm_nemotron_h-scan-tuning-32-chunks")
    assert cache_dirs == [own, own] and knobs.cache.dir == triton_cache
    assert [info[1:4] + info[-1:] for info in infos] == [(32, 16, "without and with", own)]
    prefill.tune_scan(w, 16, 16 * 100, torch.bfloat16, torch.float32, gpu)
    assert made == [32] and len(infos) == 1  # tuned already
    prefill.tune_scan(w, 16, 16 * 2 + 5, torch.bfloat16, torch.bfloat16, gpu)
    prefill.tune_scan(w, 16, 9, torch.float32, torch.float32, gpu)
    assert made == [32, 2, 1]
    assert cache_dirs[-1] == os.path.join(triton_cache, "vllm_nemotron_h-scan-tuning-1-chunks")
    prefill.tune_scan(w, 16, 64, torch.bfloat16, torch.float16, gpu)
    assert [(("failed" in message), given) for message, given in warnings] == [
        (True, False),
        (True, True),
    ]
    assert len(infos) == 3 and knobs.cache.dir == triton_cache  # none for the failed tuning
    prefill.tune_scan(w, 16, 64, torch.float16, torch.float32, torch.device("cpu"))
    assert made == [32, 2, 1, 4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tune_scan_leaves_the_scan_launching_its_choices(monkeypatch):
    """After the profile run's tuning, each signature's kernels launch with the configs their
    autotuners chose at 32 chunks, and a scan of another shape goes through no autotuner."""
    from vllm_nemotron_h.testing.op_inputs import prefill_chunks
    from vllm_nemotron_h.vllm_boundary import prefill

    monkeypatch.setattr(prefill.TunedScanKernels, "_launches", {})
    w, gpu = small_scan_weights("cuda"), torch.device("cuda")
    made = []
    inputs = prefill.tuning_inputs
    monkeypatch.setattr(prefill, "tuning_inputs", lambda *a: made.append(a[2]) or inputs(*a))
    prefill.tune_scan(w, 128, 8192, torch.bfloat16, torch.float32, gpu)
    assert made == [32]
    for given in (False, True):
        tuned = prefill.TunedScanKernels(
            prefill.scan_signature(128, w, torch.bfloat16, torch.bfloat16, torch.float32, given)
        )
        assert tuned.tuned
        for launch in tuned.launches:
            assert launch.config in [c.all_kwargs() for c in launch.autotuner.cache.values()]
    through_autotuners = record_autotuner_runs(monkeypatch)
    lengths = [37, 300, 5]
    n = sum(lengths)
    md = prefill_chunks(lengths, 128, "cuda")
    x = torch.randn(n, 24 * 32, device="cuda", dtype=torch.bfloat16)
    B, C = torch.randn(2, n, 2 * 64, device="cuda", dtype=torch.bfloat16)
    dt = torch.randn(n, 24, device="cuda", dtype=torch.bfloat16)
    chunks = (md.seq_idx_p, md.cu_chunk_seqlen_p, md.last_chunk_indices_p)
    for init in (None, torch.randn(3, 24, 32, 64, device="cuda")):
        prefill._scan(
            md, w, x, B, C, dt, torch.empty_like(x), init, torch.float32, False,
            md.query_start_loc_p, chunks,
        )  # fmt: skip
    torch.cuda.synchronize()
    assert through_autotuners == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tune_scan_chooses_apart_from_vllms_disk_cache_and_loads_its_own(monkeypatch, tmp_path):
    """With autotuning results on disk (vLLM's TRITON_CACHE_AUTOTUNING=1), the choices a
    one-chunk scan left in Triton's cache directory are not loaded: tune_scan tunes every
    kernel at 32 chunks and leaves its choices in its own subdirectory, vLLM's entries as they
    were; a later start (choices forgotten) loads them and tunes nothing."""
    from triton import knobs

    from vllm_nemotron_h.vllm_boundary import prefill

    autotuners = [getattr(module, name) for module, name in prefill.SCAN_KERNELS]
    autotuner_class, benched = type(autotuners[0]), []
    bench = autotuner_class._bench
    monkeypatch.setattr(
        autotuner_class,
        "_bench",
        lambda self, *a, **k: benched.append(self) or bench(self, *a, **k),
    )

    def forget_choices() -> None:  # as a new process: no choice in memory
        benched.clear()
        monkeypatch.setattr(prefill.TunedScanKernels, "_launches", {})
        for autotuner in autotuners:
            monkeypatch.setattr(autotuner, "cache", {})
            monkeypatch.setattr(autotuner, "cache_results", True)

    def choices_on_disk(directory) -> dict[str, str]:
        return {
            str(p.relative_to(directory)): p.read_text() for p in directory.rglob("*.autotune.json")
        }

    w, gpu = small_scan_weights("cuda"), torch.device("cuda")
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path)
        forget_choices()
        one_chunk = prefill.tuning_inputs(w, 128, 1, torch.bfloat16, torch.float32, gpu)
        for init in (None, one_chunk.initial_states):  # vLLM's warm-up: through its autotuners
            prefill._vllm_scan(
                one_chunk.md, w, one_chunk.x, one_chunk.B, one_chunk.C, one_chunk.dt,
                one_chunk.out, init, torch.float32, False, one_chunk.cu_seqlens,
                one_chunk.chunks,
            )  # fmt: skip
        vllms = choices_on_disk(tmp_path)
        kernels = {name for _, name in prefill.SCAN_KERNELS}
        assert {Path(p).name.split(".")[0] for p in vllms} == kernels
        forget_choices()
        prefill.tune_scan(w, 128, 8192, torch.bfloat16, torch.float32, gpu)
        assert {id(a) for a in benched} == {id(a) for a in autotuners}
        own = tmp_path / "vllm_nemotron_h-scan-tuning-32-chunks"
        assert {Path(p).name for p in choices_on_disk(own)} == {Path(p).name for p in vllms}
        on_disk = choices_on_disk(tmp_path)
        assert {p: on_disk[p] for p in vllms} == vllms  # vLLM's entries as they were
        chosen = [{key: str(c) for key, c in a.cache.items()} for a in autotuners]
        forget_choices()
        prefill.tune_scan(w, 128, 8192, torch.bfloat16, torch.float32, gpu)
        assert benched == []
        assert [{key: str(c) for key, c in a.cache.items()} for a in autotuners] == chosen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [[128], [37, 300, 5]])
@pytest.mark.parametrize("initial", [False, True], ids=["no-initial", "initial"])
def test_the_plugins_scan_equals_vllms_and_skips_its_autotuners(
    monkeypatch, state_dtype, lengths, initial
):
    """On a Mamba layer of Nano 9B v2's shape: the plugin's scan (vLLM's kernels with their
    tuned configs) gives vLLM's scan's y and final states bit for bit, and once resolved it
    launches no kernel through an autotuner."""
    from vllm_nemotron_h.testing.op_inputs import prefill_chunks
    from vllm_nemotron_h.vllm_boundary import prefill

    heads, head_dim, groups, d_state, chunk_size = 128, 80, 8, 128, 128
    n, dev = sum(lengths), "cuda"
    w = prefill.ScanWeights(
        -torch.rand(heads, device=dev) - 0.5, torch.randn(heads, device=dev),
        torch.randn(heads, device=dev), heads, head_dim, groups, d_state, 3,
    )  # fmt: skip
    x = torch.randn(n, heads * head_dim, device=dev, dtype=torch.bfloat16)
    B, C = torch.randn(2, n, groups * d_state, device=dev, dtype=torch.bfloat16)
    dt = torch.randn(n, heads, device=dev, dtype=torch.bfloat16)
    init = None
    if initial:
        init = torch.randn(len(lengths), heads, head_dim, d_state, device=dev).to(state_dtype)
    md = prefill_chunks(lengths, chunk_size, dev)
    cu_seqlens = md.query_start_loc_p
    chunks = (md.seq_idx_p, md.cu_chunk_seqlen_p, md.last_chunk_indices_p)
    args = (md, w, x, B, C, dt)
    tail = (init, state_dtype, False, cu_seqlens, chunks)

    vllm_out = torch.empty_like(x)
    vllm_states = prefill._vllm_scan(*args, vllm_out, *tail)
    tuned_runs = [prefill._scan(*args, torch.empty_like(x), *tail) for _ in range(2)]

    through_autotuners = record_autotuner_runs(monkeypatch)
    out = torch.empty_like(x)
    states = prefill._scan(*args, out, *tail)
    torch.cuda.synchronize()
    assert through_autotuners == []
    assert torch.equal(out, vllm_out) and torch.equal(states, vllm_states)
    assert all(torch.equal(s, vllm_states) for s in tuned_runs)
