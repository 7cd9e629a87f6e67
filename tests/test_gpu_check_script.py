"""bench/gpu_check.sh's dry run (this machine has no GPU) in a python with only the GPU machine's packages.

That machine runs the script with its image's python: torch, CuPy, transformers and pytest but no redis,
Django, Celery or channels (shared/gpu/image-packages.txt, mirrored in bench/gpu_webdeps.py). So PYTHON
here is a wrapper that starts this venv's python with -S and, after the PYTHONPATH the script sets, a
folder of links to this venv's distributions that the image also has (tests/gpu_image_site.py): imports,
importlib.metadata and pytest's plugin entry points all see that machine's package set. The run prints one
line per step, each passed, failed or skipped with its reason, and the GPU steps are skipped because torch
sees no CUDA device. Its collect step (`pytest --collect-only -m gpu` over the paths its gpu-tests step
runs, GPU_TESTS) must pass and list the GPU tests: a conftest that imports a web package would stop
pytest there before any GPU test ran. Every test file that marks a test `gpu` is in GPU_TESTS, so none
is left out of the GPU run.

Every step works under that package set on a CPU machine: machine reports no nvidia-smi and no CuPy (this
venv has none), nvrtc compiles with the nvidia-cuda-nvrtc wheel the image has too, and the steps after
collect are skipped before they would need CUDA, gguf or the web packages. No dry run uses this venv's
whole package set: the suite itself collects under it. (The wall time, about half a minute on a quiet
machine, most of it the collection, is reported, not asserted: these machines are shared and noisy.)

What the run leaves for the device machine to bring back is checked too: the steps' caps, read from the
script, add up to at most its budget of about 300 s; every python it starts runs unbuffered and with the
native CPU kernels off (the wrapper records its environment), and nothing is built into a fresh
TORCH_EXTENSIONS_DIR; $OUT holds just the summary and one tarball of the logs: the device tool brings
back at most 8 files from it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.gpu_image_site import image_site

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["machine", "wheels", "nvrtc", "collect", "gpu-tests", "decode-attention", "gemm-bench", "decode-bench",
         "int4-bench", "serving-bench"]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
DEVICE_FILES_BACK = 8  # the most files the device tool brings back from $OUT


def image_python(tmp_path: Path, environments: Path | None = None) -> Path:
    """An executable that runs this venv's python as the GPU machine's: -S, and the image's packages
    after whatever PYTHONPATH it is given, where that machine's site-packages would be. With
    `environments`, each start appends the two variables the check must set to that file."""
    site = tmp_path / "site"
    site.mkdir()
    left_out = image_site(site)
    assert {"django", "redis", "celery", "channels"} <= set(left_out), "liveness: the web stack is really absent"
    wrapper = tmp_path / "python"
    record = "" if environments is None else \
        f"echo \"unbuffered=$PYTHONUNBUFFERED cpu_kernel=$WORKBENCH_CPU_KERNEL\" >>{shlex.quote(str(environments))}\n"
    wrapper.write_text(f"#!/bin/sh\n{record}PYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{shlex.quote(str(site))} "
                       f"exec {shlex.quote(sys.executable)} -S \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def test_every_gpu_marked_test_is_in_the_paths_the_script_runs():
    paths = re.search(r'^GPU_TESTS="([^"]*)"', SCRIPT.read_text(), re.M).group(1).split()
    marked = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").rglob("test_*.py")
              if re.search(r"pytest\.mark\.gpu\b|mark\.gpu\b", path.read_text())}
    assert {"tests/engine/test_gpu.py", "tests/kernels/test_kernels.py"} <= marked, "liveness: the marks are found"
    left_out = sorted(path for path in marked if not any(path == p or path.startswith(p.rstrip("/") + "/")
                                                         for p in paths))
    assert not left_out, f"GPU-marked tests bench/gpu_check.sh does not run: {left_out}"


def test_the_steps_caps_add_up_to_at_most_the_budget():
    text = SCRIPT.read_text()
    budget = int(re.search(r"^BUDGET=(\d+)", text, re.M).group(1))
    caps = dict(pair.split(":") for pair in re.search(r'^CAPS="([^"]*)"', text, re.M).group(1).split())
    assert list(caps) == STEPS
    assert sum(int(cap) for cap in caps.values()) <= budget <= 300, (caps, budget)


@pytest.mark.slow
def test_a_dry_run_under_the_images_packages_prints_each_step_and_collects_the_gpu_tests(tmp_path):
    environments = tmp_path / "environments"
    python, logs, out, extensions = image_python(tmp_path, environments), tmp_path / "logs", tmp_path / "out", \
        tmp_path / "extensions"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "DJANGO"))}
    probe = subprocess.run([python, "-c", "import django"], env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                           capture_output=True)
    assert probe.returncode != 0, "liveness: django must not import in the image's python"
    environments.unlink()  # the probe's start: only the script's are checked

    env.update(PYTHON=str(python), GPU_CHECK_LOGS=str(logs), OUT=str(out), TORCH_EXTENSIONS_DIR=str(extensions))
    run = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [line for line in lines if line.startswith("step ")]
    assert [re.match(r"step ([\w-]+):", line).group(1) for line in steps] == STEPS
    assert all(re.match(r"step [\w-]+: (passed \(\d+s\)|skipped: \S.*)", line) for line in steps), steps
    assert len(lines) == len(steps) + 2 and re.fullmatch(r"gpu_check: ok in \d+s", lines[-1]), lines
    plan = re.fullmatch(r"gpu_check: 10 steps, caps adding up to (\d+)s of a (\d+)s budget; logs in .*", lines[0])
    assert plan and int(plan.group(1)) <= int(plan.group(2)) <= 300, lines[0]
    for gpu_step in ("gpu-tests", "decode-attention", "gemm-bench", "decode-bench", "int4-bench", "serving-bench"):
        assert f"step {gpu_step}: skipped: torch sees no CUDA device" in lines
    assert "step collect: passed" in run.stdout

    starts = environments.read_text().splitlines()
    assert len(starts) >= 3 and set(starts) == {"unbuffered=1 cpu_kernel=off"}, starts
    assert not extensions.exists() or not any(extensions.iterdir()), "a native build was started"

    back = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert back == ["gpu_check.tar.gz", "gpu_check.txt"] and len(back) <= DEVICE_FILES_BACK, back
    assert (out / "gpu_check.txt").read_text() == run.stdout
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        packed = {Path(name).name: tar.extractfile(name).read().decode() for name in tar.getnames()
                  if name.endswith(".log")}
    assert {"machine.log", "nvrtc.log", "collect.log"} <= set(packed), sorted(packed)

    collect_log = packed["collect.log"]
    assert collect_log == (logs / "collect.log").read_text()
    collected = [line for line in collect_log.splitlines() if "::" in line]
    assert any(line.startswith("tests/engine/test_gpu.py::") for line in collected), collect_log[-4000:]
    assert any(line.startswith("tests/kernels/test_kernels.py::test_ring_argmax_cupy") for line in collected), \
        collect_log[-4000:]
