"""`pytest --collect-only -m gpu` succeeds with only the packages of the GPU machine's image.

That machine's python has torch, CuPy, transformers and pytest but no redis, Django, Celery or
channels (shared/gpu/image-packages.txt, mirrored in GPU_IMAGE below): a conftest that imports one of
them stops pytest before any GPU test runs. The check runs pytest in a python whose site-packages is a
folder of links to this venv's distributions that the image also has, and nothing else: imports,
importlib.metadata and pytest's plugin entry points all see that machine's package set.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = ROOT.parent / "shared" / "gpu" / "image-packages.txt"
# The image's packages this venv can have (read from IMAGE_LIST on 2026-11-17): the check keeps working
# where shared/ is absent, and the list file, where present, must agree with it.
GPU_IMAGE = frozenset("""
accelerate certifi charset-normalizer click cuda-bindings cuda-pathfinder cupy-cuda13x filelock fsspec
hf-xet httpcore httpx huggingface-hub idna iniconfig jinja2 markdown-it-py markupsafe mdurl mpmath
networkx numpy nvidia-cuda-nvrtc packaging pillow pip pluggy prometheus-client psutil pygments pytest
pyyaml regex requests rich safetensors setuptools shellingham six sympy tokenizers torch tqdm
transformers typer typing-extensions urllib3 anyio h11 annotated-doc wheel
""".split())


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def with_requirements(names: frozenset[str]) -> set[str]:
    """`names` and what they require here, transitively: this venv's versions of the image's packages
    may need a dependency the image's versions do not (they bring their own)."""
    dists = {normalized(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    wanted, todo = set(), [n for n in names if n in dists]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        for requirement in dists[name].requires or ():
            if "extra ==" not in requirement:
                dep = normalized(re.split(r"[ ;<>=!~\[(]", requirement.strip(), maxsplit=1)[0])
                if dep in dists:
                    todo.append(dep)
    return wanted


def image_site(folder: Path) -> list[str]:
    """Link into `folder` every top-level entry of the distributions the image also has; returns the
    distributions left out."""
    left_out, wanted = [], with_requirements(GPU_IMAGE)
    for dist in importlib.metadata.distributions():
        name = normalized(dist.metadata["Name"])
        if name not in wanted:
            left_out.append(name)
            continue
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or ()} | {Path(dist._path).name}
        for top in tops:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            source, link = base / top, folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return left_out


def test_the_image_list_agrees_with_gpu_image():
    if not IMAGE_LIST.exists():
        pytest.skip(f"{IMAGE_LIST} is not on this machine")
    listed = {normalized(line) for line in IMAGE_LIST.read_text().split("\n") if line and not line.startswith("#")}
    assert GPU_IMAGE <= listed, f"not on the image: {sorted(GPU_IMAGE - listed)}"


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
    assert names <= GPU_IMAGE, f"not what the GPU machine runs: {sorted(names - GPU_IMAGE)}"
