"""vLLM's OpenAI-compatible server for tests: started through examples/serve.sh (the way users
start it, the plugin loaded through its entry point only), on a loopback port."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from tests.engines import ROOT, TINY_ENGINE, engine_env

# TINY_ENGINE as `vllm serve` flags: --dtype float32 ... --enforce-eager
TINY_SERVER_ARGS = [
    arg
    for key, value in TINY_ENGINE.items()
    for arg in (["--" + key.replace("_", "-")] + ([] if value is True else [str(value)]))
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def openai_server(
    model: str,
    *args: str,
    log_name: str,
    timeout: float = 300,
    tiny_flags: bool = True,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Starts the server on ``model`` with ``args`` (after TINY_SERVER_ARGS unless
    ``tiny_flags`` is false) and ``env`` added to engine_env(); yields its base URL once
    /health answers. Its log goes to .cache/<log_name> (quoted in the failure if it dies
    while starting)."""
    port = free_port()
    log_path = ROOT / ".cache" / log_name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        cmd = ["bash", str(ROOT / "examples" / "serve.sh"), model, "--host", "127.0.0.1"]
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), *(TINY_SERVER_ARGS if tiny_flags else ()), *args],
            env=engine_env(**(env or {})),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while not healthy(url):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"server did not start:\n{log_path.read_text()[-4000:]}")
                time.sleep(1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{([^}]*)\})? ([-+0-9.e]+|nan)$")


def server_metrics(url: str) -> dict[str, float]:
    """The server's Prometheus gauges and counters, keyed by name (plus the finished_reason
    or reason label where there is one, e.g. "vllm:request_success_total[length]")."""
    found: dict[str, float] = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        reason = re.search(r'reason="([a-z_]+)"', labels or "")
        found[name + (f"[{reason.group(1)}]" if reason else "")] = float(value)
    return found
