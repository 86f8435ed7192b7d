"""Starting engines for tests: in a subprocess (own environment) or in this process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).with_name("engine_runner.py")
ROOT = Path(__file__).resolve().parents[1]

# Engine arguments of the CPU tests on the tiny checkpoints (the server gets the same as flags).
TINY_ENGINE = dict(
    dtype="float32", max_model_len=256, gpu_memory_utilization=0.1, enforce_eager=True
)
# vLLM's ngram drafter: 3 draft tokens from matches of 2 to 4 tokens in the context.
NGRAM = dict(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4, prompt_lookup_min=2)


def prompts_with_repeats(seed: int, n: int) -> list[list[int]]:
    """Prompts made of a repeated phrase (the drafter finds drafts in them and in the tiny
    models' repetitive output) of different lengths."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(4, 500) for _ in range(rng.randint(2, 6))]
        out.append([1] + phrase * rng.randint(2, 12) + [rng.randrange(4, 500)])
    return out


def prefix_cache_prompts(seed: int = 5) -> tuple[list[list[int]], list[list[int]]]:
    """Fillers (8 prompts of 21-151 tokens: they leave slots and rings part used), then
    prompts of 301 to 458 tokens each extending the one before (each hits the blocks its
    predecessor's prefill cached)."""
    rng = random.Random(seed)
    fillers = [[1] + [rng.randrange(3, 500) for _ in range(rng.randint(20, 150))] for _ in range(8)]
    prompts = [[1] + [rng.randrange(3, 500) for _ in range(300)]]
    for extra in (37, 50, 70):
        prompts.append(prompts[-1] + [rng.randrange(3, 500) for _ in range(extra)])
    return fillers, prompts


# Speculation on the tiny "dense" checkpoint: the first two lead it into output that repeats
# (drafts accepted); a short prompt before one-token prompts (vLLM 0.32 may schedule a
# one-token prompt with placeholder drafts behind it, a prefill row: vllm_boundary.metadata).
SPECULATION_PROMPTS = (
    [[1] + [7, 8, 9, 10, 11] * 8, [1] + [30, 31, 32] * 12 + [40]]
    + prompts_with_repeats(3, 10)
    + [[1, 5, 6], [1], [260]]
)

# Tensor parallel on CPU: two workers need one core each (otherwise: 'Not enough allowed NUMA
# nodes to bind threads').
TP_ENV = dict(VLLM_CPU_OMP_THREADS_BIND="0|1")


def engine_env(**extra: str) -> dict[str, str]:
    """The environment for engine processes: no Triton interpreter (kernel tests set it),
    insecure serialization on (apply_model sends a function to the worker)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def keep_log(spec: dict, log: str) -> None:
    """With $ENGINE_LOG_DIR set (GPU jobs), writes an engine's whole output there, passed or
    not: vLLM's timestamped lines say where a slow start spent its time."""
    if os.environ.get("ENGINE_LOG_DIR"):
        logs = Path(os.environ["ENGINE_LOG_DIR"])
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"engine-{time.strftime('%H%M%S')}-{os.getpid()}-{random.randrange(1000)}.log"
        path.write_text(json.dumps(spec) + "\n" + log)


def _run(spec: dict, timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            [sys.executable, str(RUNNER), json.dumps(spec)],
            env=engine_env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as e:
        # the engine's log so far says where it stopped (a hang, or a slow start)
        log = "".join(
            (s.decode(errors="replace") if isinstance(s, bytes) else s) or ""
            for s in (e.stdout, e.stderr)
        )
        keep_log(spec, log)
        tail = log[-6000:]
        raise RuntimeError(f"engine still running after {timeout:.0f} s:\n{tail}") from None
    keep_log(spec, proc.stdout + proc.stderr)  # vLLM logs to stdout
    return proc


def run_engine(spec: dict, timeout: float = 900, **env: str) -> dict:
    """Runs tests/engine_runner.py with ``spec`` in a new process and returns its result."""
    proc = _run(spec, timeout, env)
    for line in proc.stdout.splitlines():
        if line.startswith("ENGINE_RESULT "):
            return json.loads(line[len("ENGINE_RESULT ") :])
    raise RuntimeError(f"engine failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")


def run_engine_expect_failure(spec: dict, timeout: float = 600, **env: str) -> str:
    """Runs an engine that must fail to start; returns its output (vLLM logs go to both)."""
    proc = _run(spec, timeout, env)
    assert "ENGINE_RESULT" not in proc.stdout, "the engine started although it should not"
    return proc.stdout + proc.stderr
