"""Triton's interpreter for the kernel tests where no CUDA device is: the Triton kernels then run on CPU
tensors (TRITON_INTERPRET=1), compared with their torch paths the same way a GPU machine compares the
compiled ones.

Triton reads TRITON_INTERPRET when it is imported (its own library kernels) and when a kernel is
decorated, so a test module asks for it at its top, before either, for the whole process. Not on a GPU
machine: there the same process runs the compiled kernels (the gpu-marked tests).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch


def select() -> bool:
    """Whether this process interprets the kernels (no CUDA here); skips the calling module where Triton
    is missing, or was imported before the interpreter could be chosen."""
    interpreted = not torch.cuda.is_available()
    if interpreted:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("triton was imported before this module could select its interpreter; run this file alone",
                        allow_module_level=True)
        os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton", reason="triton is not installed (pip install triton: the test extra has it)")
    return interpreted
