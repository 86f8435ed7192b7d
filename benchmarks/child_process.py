"""The benchmarks' engine processes: a benchmark runs each engine in a process of its own
(``script --child SPEC``, the plugin or vLLM's built-in model), which prints its result as one
``CHILD_RESULT`` line of JSON on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

CHILD_RESULT = "CHILD_RESULT "


def answer_child(child: Callable[..., dict]) -> bool:
    """In a process run_impl started (``script --child SPEC``): prints ``child(**SPEC)`` as its
    CHILD_RESULT line and returns True; elsewhere False."""
    if sys.argv[1:2] != ["--child"]:
        return False
    print(CHILD_RESULT + json.dumps(child(**json.loads(sys.argv[2]))), flush=True)
    return True


def run_impl(script: str, impl: str, spec: dict, **env: str) -> dict:
    """Runs ``script --child SPEC`` in a new process with the plugin (impl "plugin") or vLLM's
    built-in model (impl "builtin"); returns the child's CHILD_RESULT. vLLM's log passes
    through as it comes (its INFO lines go to stdout, the rest to stderr): a long engine start
    shows where it is."""
    child_env = dict(os.environ, VLLM_ALLOW_INSECURE_SERIALIZATION="1", **env)
    child_env.pop("VLLM_NEMOTRON_H_DISABLE", None)
    if impl == "builtin":
        child_env["VLLM_NEMOTRON_H_DISABLE"] = "1"
    cmd = [sys.executable, script, "--child", json.dumps(spec)]
    result = None
    with subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, text=True) as proc:
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
