"""The GPU machine's package set, as this repository records it.

That machine's python has torch, CuPy, transformers and pytest but no redis, Django, Celery or channels
(shared/gpu/image-packages.txt, mirrored in bench/gpu_webdeps.py). The mirror must agree with the list,
and the `gpu` extra must offer only what the image has. That the GPU tests collect with only those
packages is checked by bench/gpu_check.sh's dry run under them (tests/test_gpu_check_script.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.gpu_webdeps import IMAGE_PACKAGES, normalized

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = ROOT.parent / "shared" / "gpu" / "image-packages.txt"


def test_the_image_list_agrees_with_image_packages():
    """The list is mirrored in bench/gpu_webdeps.py so that the check works where shared/ is absent."""
    if not IMAGE_LIST.exists():
        pytest.skip(f"{IMAGE_LIST} is not on this machine")
    listed = {normalized(line) for line in IMAGE_LIST.read_text().split("\n") if line and not line.startswith("#")}
    assert IMAGE_PACKAGES == listed, \
        f"only mirrored: {sorted(IMAGE_PACKAGES - listed)}, only listed: {sorted(listed - IMAGE_PACKAGES)}"


def test_the_gpu_extra_offers_the_cupy_the_gpu_machine_has():
    """torch there is built for CUDA 13: a cupy-cuda12x would load a second CUDA runtime beside it."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    names = {normalized(re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0]) for requirement in extra}
    assert any(name.startswith("cupy") for name in names), "liveness: the gpu extra offers CuPy"
    assert names <= IMAGE_PACKAGES, f"not what the GPU machine runs: {sorted(names - IMAGE_PACKAGES)}"
