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


def test_first_prompt_tokens_with_placeholder_drafts_run_as_decodes():
    """A prompt's one token scheduled with vLLM 0.32's placeholder drafts (a row of 1 + drafts
    tokens, no state before it) is marked for the decode path like a one-token prompt; where
    the split leaves it among the prefills, its placeholder tokens are named for the prefill
    to pass the state through."""
    from types import SimpleNamespace

    import torch

    from vllm_nemotron_h.vllm_boundary.metadata import PlaceholderPrefills, first_tokens_as_decodes

    # Rows: a decode with 2 drafts, a 3-token prompt, a 1-token prompt with 2 placeholders,
    # a 1-token prompt, a second chunk of a prompt (state before it).
    query_start = torch.tensor([0, 3, 6, 9, 10, 13])
    common = SimpleNamespace(
        is_prefilling=torch.tensor([False, True, True, True, True]),
        seq_lens_cpu_upper_bound=torch.tensor([40, 3, 3, 1, 20]),
        query_start_loc_cpu=query_start,
        replace=lambda **kw: SimpleNamespace(**{**vars(common), **kw}),
    )
    drafts = torch.tensor([2, -1, 2, -1, -1])
    marked, rows = first_tokens_as_decodes(common, drafts)
    assert rows.tolist() == [2, 3]
    assert marked.is_prefilling.tolist() == [False, True, False, False, True]
    _, rows_without_drafts = first_tokens_as_decodes(common)
    assert rows_without_drafts.tolist() == [3]
    # a step of decodes alone comes back as it was
    decodes = SimpleNamespace(**{**vars(common), "is_prefilling": torch.zeros(5, dtype=bool)})
    marked_decodes, no_rows = first_tokens_as_decodes(decodes, drafts)
    assert marked_decodes is decodes and no_rows is None
    # The split stops at the 3-token prompt: one decode row (3 tokens), rows 2 and 3 prefill.
    metadata = SimpleNamespace(
        num_decodes=1, num_decode_tokens=3, state_indices_tensor_p=torch.tensor([5, 6, 7, 8])
    )
    found = PlaceholderPrefills.of(common, rows, metadata)
    assert found.rows.tolist() == [1]  # the prefill rows: 3-token prompt, row 2, row 3, row 4
    assert found.tokens.tolist() == [3]  # prefill-relative: row 2 starts at token 6 - 3
    assert found.placeholders.tolist() == [4, 5]
    assert PlaceholderPrefills.of(common, torch.tensor([3]), metadata) is None
