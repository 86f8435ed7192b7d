"""Kernel tests run the Triton kernels: on a GPU natively, on CPU in the Triton interpreter.

TRITON_INTERPRET must be set before the kernel modules are imported (triton.jit reads it at
decoration time); engine fixtures remove it again for the processes they start.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
