"""`pytest --collect-only -m gpu` succeeds with only the packages of the GPU machine's image.

That machine's python has torch, CuPy, transformers and pytest but no redis, Django, Celery or
channels (shared/gpu/image-packages.txt, mirrored in bench/gpu_webdeps.py): a conftest that imports one of
them stops pytest before any GPU test runs. The check runs pytest in a python whose site-packages is a
folder of links to this venv's distributions that the image also has (tests/gpu_image_site.py): imports,
importlib.metadata and pytest's plugin entry points all see that machine's package set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_webdeps import IMAGE_PACKAGES, normalized
from tests.gpu_image_site import image_site

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = ROOT.parent / "shared" / "gpu" / "image-packages.txt"


def test_the_image_list_agrees_with_image_packages():
    """The list is mirrored in bench/gpu_webdeps.py so that the check works where shared/ is absent."""
    if not IMAGE_LIST.exists():
        pytest.skip(f"{IMAGE_LIST} is not on this machine")
    listed = {normalized(line) for line in IMAGE_LIST.read_text().split("\n") if line and not line.startswith("#")}
    assert IMAGE_PACKAGES == listed, f"only mirrored: {sorted(IMAGE_PACKAGES - listed)}, only listed: {sorted(listed - IMAGE_PACKAGES)}"


@pytest.mark.slow
def test_gpu_tests_collect_with_only_the_gpu_images_packages(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    left_out = image_site(site)
    assert {"django", "redis", "celery", "channels"} <= set(left_out), "liveness: the web stack is really absent"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "DJANGO"))}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{site}"
    probe = subprocess.run([sys.executable, "-S", "-c", "import django"], env=env, cwd=ROOT, capture_output=True)
    assert probe.returncode != 0, "liveness: django must not import in the image's python"
    run = subprocess.run([sys.executable, "-S", "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                          "-p", "no:cacheprovider"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "web-stack tests not collected" in out or "tests/engine/test_gpu.py" in out
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert any("tests/engine/test_gpu.py::" in line for line in collected), out[-4000:]
    assert any("tests/kernels/test_kernels.py::test_ring_argmax_cupy" in line for line in collected), out[-4000:]


def test_the_gpu_extra_offers_the_cupy_the_gpu_machine_has():
    """torch there is built for CUDA 13: a cupy-cuda12x would load a second CUDA runtime beside it."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    names = {normalized(re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0]) for requirement in extra}
    assert any(name.startswith("cupy") for name in names), "liveness: the gpu extra offers CuPy"
    assert names <= IMAGE_PACKAGES, f"not what the GPU machine runs: {sorted(names - IMAGE_PACKAGES)}"
