"""Where no CUDA device is, the whole test session runs Triton under its interpreter (tests/conftest.py):
a module collected before the kernel tests may import triton (torch._dynamo does), and Triton reads
TRITON_INTERPRET only then; without the session's choice the kernel tests were skipped whole in the suite
(tests/kernels/triton_interpreter.py skips where triton came in compiled)."""

from __future__ import annotations

import os

import pytest
import torch


def test_the_session_interprets_triton_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the kernels are compiled")
    assert os.environ.get("TRITON_INTERPRET") == "1"
