"""The native CPU kernels' build survives a builder that was killed: cpp_extension marks a build under way
with a plain `lock` file in the build directory, which a process killed mid-build (a server stopped
during its first start) leaves behind, and every later load then waited for it forever. A fresh
process must load the built library regardless, at once."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from engine.kernels.cpu.build import build_directory

ROOT = Path(__file__).resolve().parents[2]  # not tests.cluster's: that imports redis, which the GPU image lacks
LOAD = "from engine.kernels import cpu; print(cpu.native_available(), cpu.unavailable_reason())"


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_load(native_cpu_kernels):
    directory = build_directory()
    # Left as the killed builder would have: under our build lock, so that no live builder of this
    # checkout (a shared server's first load) is between its own lock file and its removal.
    with open(directory / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (directory / "lock").touch()
    try:
        loaded = subprocess.run([sys.executable, "-c", LOAD], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        (directory / "lock").unlink(missing_ok=True)
    assert loaded.stdout.split() == ["True", "None"], loaded.stderr[-2000:]
    assert "left by a build that was killed" in loaded.stderr, "liveness: the load met the stale lock"
