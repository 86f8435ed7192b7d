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
