"""The speculative decode tail's conv on CPU as one compiled op (cpu_conv.cpp): cpu.py's
PyTorch conv takes about ten tensor ops a layer, and with a step's few rows each op's fixed
cost is the whole cost. Built with torch's C++ extension builder at the first use in a
process that needs it (g++ and ninja; about 15 s once a machine, then loaded from torch's
extensions directory, ``TORCH_EXTENSIONS_DIR``); where it cannot be built, the PyTorch conv
serves (the engine log says which runs, and why)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("cpu_conv.cpp")
# the extension's name; torch rebuilds it when the source changes
EXTENSION = "vllm_nemotron_h_cpu_conv"


@functools.cache
def _build() -> tuple[Any, str | None]:
    """The op, or None and why it could not be built (once a process)."""
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(
            name=EXTENSION, sources=[str(SOURCE)], extra_cflags=["-O3"],
            is_python_module=False, verbose=False,
        )  # fmt: skip
    except Exception as error:  # no compiler, no ninja, a failed build: the PyTorch conv serves
        lines = str(error).strip().splitlines() or [""]
        return None, f"{type(error).__name__}: {lines[-1][:300]}"
    return torch.ops.vllm_nemotron_h.speculative_conv, None


def compiled_conv() -> Any | None:
    """The compiled op (``speculative_conv(xbc, conv_state, weight, bias, slots, counts)``),
    or None where it could not be built."""
    return _build()[0]


def build_failure() -> str | None:
    """Why the op could not be built; None where it was."""
    return _build()[1]
