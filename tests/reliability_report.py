"""reliability.md, written from the test run: each reliability test adds one row (what was
tried, how much of it, the result). Rows of checks that did not run this time are kept from
the previous run with their own date, so a partial run never drops a row.

`make test` writes it to .cache/reliability/ (tests do not touch tracked files);
`make reliability-doc` sets VLLM_NEMOTRON_H_REPORT_DIR=docs to refresh docs/reliability.md."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT_DIR = ROOT / os.environ.get("VLLM_NEMOTRON_H_REPORT_DIR", ".cache/reliability")

HEADER = """# Reliability: what was tried and what held

Written by the tests (`make reliability-doc`: `tests/test_reliability.py` and
`tests/kernels/test_properties.py`; `make test` writes the same table to
`.cache/reliability/`), not by hand. Each row is one check: what was tried, how much, and the
result. A row is added only by a test that passed; a check that fails keeps its previous row
and fails the run.

| check | what was tried | result | run |
|---|---|---|---|
"""


def device_name() -> str:
    """The GPU the engines of this run use, or "CPU"."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


class ReliabilityReport:
    def __init__(self, directory: Path = REPORT_DIR) -> None:
        self.json_path = directory / "reliability.json"
        self.md_path = directory / "reliability.md"
        self.rows: dict[str, dict] = {}

    def add(self, check: str, tried: str, result: str) -> None:
        """One row per check and device: a GPU run keeps the CPU run's rows and adds its own."""
        device = device_name()
        key = check if device == "CPU" else f"{check} ({device})"
        self.rows[key] = dict(tried=tried, result=result, run=self._stamp(device))

    @staticmethod
    def _stamp(device: str) -> str:
        import vllm

        day = time.strftime("%Y-%m-%d", time.gmtime())
        return f"{day}, vLLM {vllm.__version__}, {device} ({platform.machine()})"

    def write(self) -> None:
        if not self.rows:
            return
        rows = json.loads(self.json_path.read_text()) if self.json_path.exists() else {}
        rows.update(self.rows)
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        lines = [
            f"| {check} | {r['tried']} | {r['result']} | {r['run']} |"
            for check, r in sorted(rows.items())
        ]
        self.md_path.write_text(HEADER + "\n".join(lines) + "\n")
