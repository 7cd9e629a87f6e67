"""bench/gpu_check.sh on a machine without a GPU (a dry run) prints one line per step, each passed,
failed or skipped with its reason; the GPU steps are skipped because torch sees no CUDA device. (Its
wall time, about half a minute here, is reported, not asserted: these machines are shared and noisy.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["machine", "wheels", "nvrtc", "collect", "gpu-tests", "decode-attention", "decode-bench", "int4-bench",
         "serving-bench"]


@pytest.mark.slow
def test_a_dry_run_prints_one_line_per_step_with_its_reason(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_LOGS": str(tmp_path)}
    run = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [line for line in lines if line.startswith("step ")]
    assert [re.match(r"step ([\w-]+):", line).group(1) for line in steps] == STEPS
    assert all(re.match(r"step [\w-]+: (passed \(\d+s\)|skipped: \S.*)", line) for line in steps), steps
    assert len(lines) == len(steps) + 1 and re.fullmatch(r"gpu_check: ok in \d+s", lines[-1]), lines
    for gpu_step in ("gpu-tests", "decode-attention", "decode-bench", "int4-bench", "serving-bench"):
        assert f"step {gpu_step}: skipped: torch sees no CUDA device" in lines
    assert "step collect: passed" in run.stdout
