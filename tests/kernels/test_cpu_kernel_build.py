"""The native CPU kernels' build survives a builder that was killed: cpp_extension marks a build under way
with a plain `lock` file in the build directory, which a process killed mid-build (a server stopped
during its first start) leaves behind, and every later load then waited for it forever. A fresh
process must load the built library regardless, at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from engine.kernels.cpu.build import build_directory

ROOT = Path(__file__).resolve().parents[2]  # not tests.cluster's: that imports redis, which the GPU image lacks
LOAD = "from engine.kernels import cpu; print(cpu.native_available(), cpu.unavailable_reason())"


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_load(native_cpu_kernels, tmp_path):
    # On a copy of the built directory that no other process loads from: any load of the shared one (a
    # server another test starts meanwhile) would clear the stale lock before this load could meet it.
    # The copy keeps the files' times, so the load finds the library built and only loads it.
    built = build_directory()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    private = tmp_path / built.name
    shutil.copytree(built, private)
    (private / "lock").touch()  # left as the killed builder would have
    loaded = subprocess.run([sys.executable, "-c", LOAD], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert loaded.stdout.split() == ["True", "None"], loaded.stderr[-2000:]
    assert "left by a build that was killed" in loaded.stderr, "liveness: the load met the stale lock"
