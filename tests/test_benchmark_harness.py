"""The benchmarks' harness without an engine: a process kept across calls answers each
request in order and says when it ended (benchmarks/child_process.py), and the pair
statistics e2e.py's --pairs reports (the median's interval, where two outputs part)."""

from __future__ import annotations

import statistics
import sys
import textwrap

import pytest

from tests.engines import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from child_process import EngineProcess  # noqa: E402
from e2e import first_differences, median_interval  # noqa: E402

# A stand-in for an engine script: its state is built once from the spec, and a request that
# asks for it ends the process as an engine crash would.
SERVER = """
import sys
sys.path.insert(0, {benchmarks!r})
from child_process import answer_requests

def build(start):
    print("a log line of the engine's start")
    return dict(total=start)

def answer(state, request):
    if request.get("crash"):
        sys.exit(3)
    state["total"] += request["add"]
    return dict(total=state["total"])

if __name__ == "__main__":
    answer_requests(build, answer)
"""


@pytest.fixture
def server_script(tmp_path):
    path = tmp_path / "server.py"
    path.write_text(textwrap.dedent(SERVER.format(benchmarks=str(ROOT / "benchmarks"))))
    return str(path)


def test_engine_process_keeps_its_state_across_calls(server_script):
    with EngineProcess(server_script, "plugin", dict(start=10)) as proc:
        assert proc.call(dict(add=1)) == dict(total=11)
        assert proc.call(dict(add=5)) == dict(total=16)


def test_engine_process_that_ends_raises_with_its_exit_status(server_script):
    with pytest.raises(RuntimeError, match=r"plugin engine process ended \(rc=3\)"):
        with EngineProcess(server_script, "plugin", dict(start=0)) as proc:
            proc.call(dict(crash=True))


def test_median_interval_holds_the_median_and_narrows_with_more_values():
    values = [1.0 + 0.01 * ((7 * i) % 11 - 5) for i in range(60)]
    low, high = median_interval(values)
    assert low <= statistics.median(values) <= high
    wide = median_interval(values[:8])
    assert wide[1] - wide[0] > high - low
    assert median_interval([2.0] * 5) == (2.0, 2.0)


def test_first_differences_names_each_sequences_first_other_token():
    a = [[1, 2, 3], [4, 5, 6], [7, 8], [1, 2]]
    b = [[1, 2, 3], [4, 9, 6], [0, 8], [1, 2, 3]]
    assert first_differences(a, b) == [None, 1, 0, 2]
