"""The boundary with vLLM: each touchpoint's contract holds on the installed vLLM, no other
module of the plugin reaches into vLLM, and the plugin never imports the testing package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
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
    from types import SimpleNamespace

    import torch

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
