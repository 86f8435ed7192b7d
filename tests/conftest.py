"""Shared fixtures: the tiny checkpoints (built once into .cache/, reused by `make demo`)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

CACHE = Path(os.environ.get("VLLM_NEMOTRON_H_CACHE", ROOT / ".cache" / "tiny-models"))


def tiny(preset: str) -> str:
    from vllm_nemotron_h.testing.checkpoints import write_tiny_checkpoint

    return str(write_tiny_checkpoint(CACHE / preset, preset))


def with_config(src: str, dst: Path, **changes) -> str:
    """A copy of checkpoint ``src`` at ``dst`` whose config.json has ``changes`` applied."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """Path of a tiny random-weight checkpoint with tokenizer, by preset name."""
    return tiny


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Marks each test's node with whether its call passed (fixtures read it at teardown)."""
    report = yield
    if report.when == "call":
        item.passed = report.passed
    return report


@pytest.fixture(scope="session")
def reliability_report():
    """Rows for docs/reliability.md; written once at the end of the session."""
    from tests.reliability_report import ReliabilityReport

    report = ReliabilityReport()
    yield report
    report.write()


@pytest.fixture(scope="session")
def tiny_server(tiny_checkpoint):
    """One OpenAI server on the tiny dense model for all server tests: (model, base URL).
    max_num_seqs=8 so that concurrent load queues (tests/test_reliability.py)."""
    yield from serve_tiny(tiny_checkpoint, "tiny-server.log")


@pytest.fixture(scope="module")
def tiny_deferred_server(tiny_checkpoint):
    """The same server with deferred state writes (a ring of 4 tokens): requests cut off
    mid-ring leave their slots to the next requests. Stopped after the module that uses it."""
    deferred = '{"nemotron_h": {"deferred_state_writes": 4}}'
    yield from serve_tiny(
        tiny_checkpoint, "tiny-deferred-server.log", "--additional-config", deferred
    )


def serve_tiny(tiny_checkpoint, log_name: str, *args: str):
    """Yields (model, base URL) of a server on the tiny dense model (max_num_seqs 8)."""
    from tests.server import openai_server

    model = tiny_checkpoint("dense")
    with openai_server(model, "--max-num-seqs", "8", *args, log_name=log_name) as url:
        yield model, url
