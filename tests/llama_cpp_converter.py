"""llama.cpp's own HF-to-GGUF converter, as a GGUF writer independent of ours (tests/gguf_files.py).

`convert_hf_to_gguf.py` ships in the llama-cpp-python sdist (vendor/llama.cpp/), beside the `conversion`
package it imports and the `gguf-py` it puts first on its own sys.path (the release's gguf, which may be
newer than the venv's). The sdist is fetched once per machine with `pip download --no-deps
--no-binary :all:` (nothing is built or installed), its sha256 checked, and only those three parts
extracted into `~/.cache/workbench/llama-cpp-converter/<version>` (XDG_CACHE_HOME is honoured). A file
lock keeps two test processes from fetching it twice, and the folder appears under its name only when
complete, as engine/loading/packaged_models.py does for models. The converter then runs in a subprocess
of this venv's python, which has what it imports (torch, transformers, numpy, sentencepiece): one
subprocess for all the files of a call (tests/llama_cpp_convert_many.py), since importing torch and
transformers costs seconds and a small model's conversion a fraction of one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.llama_cpp_convert_many import MARKER

VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VENDORED = "vendor/llama.cpp/"
_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")
DOWNLOAD_TIMEOUT_S = 300
CONVERT_TIMEOUT_S = 120  # per file
_MANY = Path(__file__).with_name("llama_cpp_convert_many.py")


class ConverterUnavailable(RuntimeError):
    """The sdist could not be fetched (the registry unreachable): the reason, for a skip."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "workbench" / "llama-cpp-converter"


def converter_script() -> Path:
    """convert_hf_to_gguf.py of llama-cpp-python VERSION, from the cache or fetched into it."""
    target = cache_root() / VERSION
    script = target / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if script.is_file():  # another process fetched it while we waited
            return script
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
            sdist = _download(Path(scratch))
            _check_sha256(sdist)
            tree = Path(scratch) / "tree"
            _extract(sdist, tree)
            os.replace(tree, target)  # atomic: no reader sees a half-extracted converter
    return script


def convert_all(pairs: Sequence[tuple[Path, Path]], outtype: str = "f32") -> list[Path]:
    """Write each (HF directory, GGUF file) pair with llama.cpp's converter, all in one python; the
    error names the first directory that failed and holds its output."""
    for _, out in pairs:
        out.unlink(missing_ok=True)  # so that a file the run skipped cannot pass for written
    args = [str(path) for pair in pairs for path in pair]
    command = [sys.executable, str(_MANY), str(converter_script()), outtype, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S * len(pairs))
    if done.returncode != 0:
        # The output from the last file's marker on is the failed file's alone.
        before, marker, output = done.stderr.rpartition(MARKER)
        failed, _, output = output.partition("\n") if marker else ("before the first file", "", before)
        raise RuntimeError(f"convert_hf_to_gguf.py {failed.strip()} failed ({done.returncode}):\n{output[-4000:]}")
    missing = [str(out) for _, out in pairs if not out.is_file()]
    if missing:
        raise RuntimeError(f"convert_hf_to_gguf.py wrote no {', '.join(missing)}:\n{done.stderr[-4000:]}")
    return [out for _, out in pairs]


def _download(into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
               "--disable-pip-version-check", "--retries", "1", "--timeout", "20", "--dest", str(into),
               f"llama-cpp-python=={VERSION}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConverterUnavailable(f"pip download llama-cpp-python=={VERSION} took over {DOWNLOAD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConverterUnavailable(f"pip download llama-cpp-python=={VERSION} failed: {last}")
    sdists = list(into.glob("*.tar.gz"))
    if len(sdists) != 1:
        raise ConverterUnavailable(f"pip download gave {len(sdists)} sdists, expected 1")
    return sdists[0]


def _check_sha256(path: Path) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    # Not a skip: a registry that answers with other bytes is a failure to look at.
    if digest.hexdigest() != SDIST_SHA256:
        raise RuntimeError(f"{path.name}: sha256 {digest.hexdigest()} is not the recorded {SDIST_SHA256}")


def _extract(sdist: Path, into: Path) -> None:
    """The converter's three parts, at the paths it expects relative to each other."""
    prefix = f"llama_cpp_python-{VERSION}/{_VENDORED}"
    with tarfile.open(sdist) as archive:
        for member in archive:
            relative = member.name.removeprefix(prefix)
            if member.isfile() and member.name.startswith(prefix) and relative.startswith(_PARTS):
                member.name = relative
                archive.extract(member, into, filter="data")
    if not (into / "convert_hf_to_gguf.py").is_file():
        raise RuntimeError(f"{sdist.name} holds no {_VENDORED}convert_hf_to_gguf.py")
