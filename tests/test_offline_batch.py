"""examples/offline_batch.py: JSONL in, JSONL out, and a rerun resumes where it stopped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.engines import ROOT, engine_env

pytestmark = pytest.mark.engine


def run_batch(model: str, inp, out) -> str:
    engine = json.dumps(dict(dtype="float32", max_model_len=256, gpu_memory_utilization=0.1))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "offline_batch.py"),
            "--model",
            model,
            "--input",
            str(inp),
            "--output",
            str(out),
            "--max-tokens",
            "8",
            "--chunk",
            "2",
            "--engine-args",
            engine,
        ],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def test_resume_skips_written_ids(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("dense")
    prompts = [{"id": f"p{i}", "prompt": f"The history of the city {i}"} for i in range(5)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    # A previous run that stopped after two prompts (one of them with a text we can recognise).
    out.write_text(
        json.dumps(
            {
                "id": "p0",
                "prompt": prompts[0]["prompt"],
                "text": "KEPT",
                "prompt_tokens": 1,
                "completion_tokens": 1,
            }
        )
        + "\n"
        + json.dumps(
            {
                "id": "p3",
                "prompt": prompts[3]["prompt"],
                "text": "KEPT",
                "prompt_tokens": 1,
                "completion_tokens": 1,
            }
        )
        + "\n"
    )
    log = run_batch(model, inp, out)
    assert "3 prompts to run" in log
    assert "vllm_nemotron_h.model_executor.hybrid_model.NemotronHForCausalLM" in log
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"p{i}" for i in range(5)]
    assert [r["text"] for r in rows if r["id"] in ("p0", "p3")] == ["KEPT", "KEPT"]
    for r in rows:
        if r["id"] not in ("p0", "p3"):
            assert r["completion_tokens"] == 8 and r["prompt_tokens"] > 3 and r["text"]
    assert "0 prompts to run" in run_batch(model, inp, out)  # nothing left: no engine started
