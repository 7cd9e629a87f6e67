"""Collecting the tests never builds the native CPU kernels (engine/kernels/cpu/build.py).

On the GPU machine `pytest --collect-only -m gpu` imports every test module, and a module that asked
`native_available()` at import would compile the C++ kernels there from scratch (tens of seconds of a
short device budget) for tests that never run. Modules that need the kernels request the
`native_cpu_kernels` fixture (tests/conftest.py) instead, so the first test that runs builds them.

A subprocess collects the GPU tests with the build replaced by one that records who asked and refuses,
and WORKBENCH_CPU_KERNEL unset (with it `off` nothing would be built anyway: bench/gpu_check.sh sets it,
and this checks the tests need not rely on that).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

COLLECT = """
import sys, traceback
import pytest
from engine.kernels.cpu import build

asked = []

def refuse():
    asked.append("".join(traceback.format_stack(limit=14)))
    raise RuntimeError("the native CPU kernels were asked for while collecting")

build._load = refuse  # raising, so that nothing is cached and every module that asks is named
rc = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--collect-only", "-m", "gpu", "tests"])
print("BUILDS DURING COLLECTION", len(asked))
for stack in asked:
    print(stack)
from engine.kernels import cpu
try:
    cpu.native_available()
except RuntimeError:
    pass
print("BUILDS AFTER ASKING", len(asked))  # liveness: native_available() reaches the replaced build
sys.exit(rc)
"""


@pytest.mark.slow
def test_collecting_the_gpu_tests_starts_no_native_build():
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_CPU_KERNEL" and not k.startswith("PYTEST")}
    run = subprocess.run([sys.executable, "-c", COLLECT], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert "BUILDS DURING COLLECTION 0" in out, out[-8000:]
    assert "BUILDS AFTER ASKING 1" in out, out[-4000:]
    assert run.returncode == 0, out[-4000:] + run.stderr[-4000:]
    assert "tests/engine/test_gpu.py::" in out, "liveness: the GPU tests were collected"
