"""Kernel tests run the Triton kernels: on a GPU natively, on CPU in the Triton interpreter.

TRITON_INTERPRET must be set before the kernel modules are imported (triton.jit reads it at
decoration time); engine fixtures remove it again for the processes they start.
"""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

SEED_ENV = "VLLM_NEMOTRON_H_TEST_SEED"


@pytest.fixture(autouse=True)
def torch_seed() -> int:
    """Seeds torch's global generator for each test, freshly or from $VLLM_NEMOTRON_H_TEST_SEED;
    the seed is printed, so pytest shows it with a failing test's output."""
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**31))
    print(f"torch seed {seed} (replay: {SEED_ENV}={seed})")
    torch.manual_seed(seed)
    return seed
