"""The benchmarks' engine processes: a benchmark runs each engine in a process of its own
(``script --child SPEC``, the plugin or vLLM's built-in model), which prints its result as one
``CHILD_RESULT`` line of JSON on stdout; or keeps it in a process of its own across calls
(``EngineProcess``: ``script --serve-child SPEC`` answers one request line on stdin with one
CHILD_RESULT line), so that a benchmark alternates between two live engines run by run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

CHILD_RESULT = "CHILD_RESULT "


def answer_child(child: Callable[..., dict]) -> bool:
    """In a process run_impl started (``script --child SPEC``): prints ``child(**SPEC)`` as its
    CHILD_RESULT line and returns True; elsewhere False."""
    if sys.argv[1:2] != ["--child"]:
        return False
    print(CHILD_RESULT + json.dumps(child(**json.loads(sys.argv[2]))), flush=True)
    return True


def answer_requests(build: Callable[..., Any], answer: Callable[[Any, dict], dict]) -> bool:
    """In a process EngineProcess started (``script --serve-child SPEC``): ``state =
    build(**SPEC)``, a CHILD_RESULT line ``{}`` once built, then ``answer(state, request)``
    as a CHILD_RESULT line for each request line on stdin until it closes; returns True.
    Elsewhere False."""
    if sys.argv[1:2] != ["--serve-child"]:
        return False
    state = build(**json.loads(sys.argv[2]))
    print(CHILD_RESULT + "{}", flush=True)
    for line in sys.stdin:
        print(CHILD_RESULT + json.dumps(answer(state, json.loads(line))), flush=True)
    return True


def impl_env(impl: str, **env: str) -> dict[str, str]:
    """An engine process's environment: the plugin's (impl "plugin") or vLLM's built-in
    model (impl "builtin", the plugin disabled), with ``env`` on top."""
    child_env = dict(os.environ, VLLM_ALLOW_INSECURE_SERIALIZATION="1", **env)
    child_env.pop("VLLM_NEMOTRON_H_DISABLE", None)
    if impl == "builtin":
        child_env["VLLM_NEMOTRON_H_DISABLE"] = "1"
    return child_env


def run_impl(script: str, impl: str, spec: dict, **env: str) -> dict:
    """Runs ``script --child SPEC`` in a new process with the plugin (impl "plugin") or vLLM's
    built-in model (impl "builtin"); returns the child's CHILD_RESULT. vLLM's log passes
    through as it comes (its INFO lines go to stdout, the rest to stderr): a long engine start
    shows where it is."""
    cmd = [sys.executable, script, "--child", json.dumps(spec)]
    result = None
    with subprocess.Popen(
        cmd, env=impl_env(impl, **env), stdout=subprocess.PIPE, text=True
    ) as proc:
        for line in proc.stdout:
            # the result line too: a job cut short keeps its finished engines in its log
            sys.stderr.write(line)
            found = child_result(line)
            if found is not None:
                result = found
    if result is None:
        raise RuntimeError(f"{impl} {spec} failed (rc={proc.returncode}), log above")
    return result


def child_result(line: str) -> dict | None:
    """The result a child printed on this line of its stdout, or None (a line of its log)."""
    return json.loads(line[len(CHILD_RESULT) :]) if line.startswith(CHILD_RESULT) else None


class EngineProcess:
    """One implementation's engine in a process of its own, kept across calls: ``script
    --serve-child SPEC`` (the script's answer_requests) builds it at the start; ``call``
    sends it one request and returns its answer. Its log passes through to stderr as it
    comes, read while a call waits (an idle engine writes none)."""

    def __init__(self, script: str, impl: str, spec: dict, **env: str) -> None:
        self.impl = impl
        cmd = [sys.executable, script, "--serve-child", json.dumps(spec)]
        self._proc = subprocess.Popen(
            cmd, env=impl_env(impl, **env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self._answer()  # built

    def call(self, request: dict) -> dict:
        """The engine's answer to ``request``."""
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        for line in self._proc.stdout:
            sys.stderr.write(line)
            found = child_result(line)
            if found is not None:
                return found
        self._proc.wait()
        raise RuntimeError(f"the {self.impl} engine process ended (rc={self._proc.returncode})")

    def close(self) -> None:
        """Ends the process (stdin closed: its request loop returns) and waits for it."""
        self._proc.stdin.close()
        for line in self._proc.stdout:
            sys.stderr.write(line)
        self._proc.wait()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._proc.kill()
        self.close()
