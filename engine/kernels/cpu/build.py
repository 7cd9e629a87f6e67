"""Builds and loads the native CPU kernels (engine/kernels/cpu/*.cpp) on first use, once per process.

torch.utils.cpp_extension compiles them with the machine's g++ and ninja into a cache outside the repo
($TORCH_EXTENSIONS_DIR, else ~/.cache/workbench/torch_extensions, one directory per checkout), so a warm
load only links the library in. The library registers its ops under torch.ops.workbench. Where there is
no compiler or no ninja, or
the build fails, `native_available()` is False, `unavailable_reason()` says why, one log line says so, and
callers use their torch path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import platform
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from engine import environment

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SOURCES = ["ops.cpp", "qgemm_scalar.cpp", "qgemm_avx2.cpp", "qgemm_avx512.cpp", "qgemm_amx.cpp",
           "paged_attention.cpp", "paged_attention_scalar.cpp", "paged_attention_avx2.cpp",
           "paged_attention_avx512.cpp", "decoder_layer.cpp", "dense_ops.cpp", "dense_gemm_scalar.cpp",
           "dense_gemm_avx2.cpp", "dense_gemm_avx512.cpp", "swiglu.cpp", "sampling_draws.cpp"]
HEADERS = ["dispatch.h", "drivers.h", "qgemm.h", "qgemm_tile.inc", "paged_attention.h", "dense_gemm.h",
           "dense_gemm_tile.inc", "paged_attention_lanes.inc", "exp_lanes.inc", "swiglu.h"]
# No -march: the scalar path must run on any x86-64, the SIMD files raise their own target. No fp
# contraction: every fma in the kernels is written out, the same in every path. OpenMP for
# at::parallel_for (the library then uses the libgomp torch already loaded, one thread pool).
CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-Wall", "-Wno-unknown-pragmas"]
LDFLAGS = ["-fopenmp"]
NAME = "workbench_cpu_kernels"

_lock = threading.Lock()
_state: dict[str, str | None] = {}  # "reason": None once loaded, else why not; absent until tried


def build_directory() -> Path:
    """One directory per checkout: cpp_extension rebuilds when the sources' paths change, so two
    checkouts sharing one directory (a test run in a fresh clone beside a working tree) would rebuild
    over each other, each process that loads meanwhile stalling on the build."""
    root = environment.read("TORCH_EXTENSIONS_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "workbench" / "torch_extensions"
    return base / f"{NAME}-{hashlib.sha256(str(HERE).encode()).hexdigest()[:12]}"


def _find_ninja() -> str | None:
    """ninja on PATH, else the PyPI ninja package's binary beside this interpreter (a venv's bin/ is not
    on PATH when its python is run by path); that directory is then put on PATH for cpp_extension."""
    found = shutil.which("ninja")
    if found:
        return found
    beside = Path(sys.executable).parent / "ninja"
    if beside.exists():
        environment.put_on_path(str(beside.parent))
        return str(beside)
    return None


def _load() -> str | None:
    """Builds (or finds built) and loads the library; None on success, else the reason it is unavailable."""
    if environment.read("WORKBENCH_CPU_KERNEL") == "off":
        return "disabled by WORKBENCH_CPU_KERNEL=off"
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"the native CPU kernels are for x86-64 Linux, not {platform.machine()} {sys.platform}"
    compiler = environment.read("CXX") or "c++"
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not found)"
    if _find_ninja() is None:
        return "ninja not found (pip install ninja)"
    from torch.utils import cpp_extension

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    with _building(directory):
        return _compile_and_load(cpp_extension, directory)


@contextlib.contextmanager
def _building(directory: Path) -> Iterator[None]:
    """One builder at a time per directory, by an flock the kernel drops when its holder dies.
    cpp_extension's own lock is a plain file that its waiters poll for: a process killed while it
    builds (a server stopped during its first start) leaves the file behind, and every later load would
    wait for it forever. Under the flock no live process of ours holds that file, so one found is stale."""
    with open(directory / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = directory / "lock"
        if stale.exists():
            log.warning("removing %s, left by a build that was killed", stale)
            stale.unlink(missing_ok=True)
        yield


def _compile_and_load(cpp_extension: ModuleType, directory: Path) -> str | None:
    try:
        # Headers are not compiled, but their text must rebuild the library: hash them into the flags.
        digest = hashlib.sha256(b"".join((HERE / h).read_bytes() for h in HEADERS)).hexdigest()[:16]
        stamp = f"-DWORKBENCH_HEADERS_HASH={digest}"
        cpp_extension.load(name=NAME, sources=[str(HERE / s) for s in SOURCES], extra_cflags=CFLAGS + [stamp],
                           extra_ldflags=LDFLAGS, extra_include_paths=[str(HERE)],
                           build_directory=str(directory), is_python_module=False, verbose=False)
    except Exception as exc:  # a failed build of any kind: the caller falls back to torch
        lines = str(exc).strip().splitlines() or [""]
        first_error = next((line for line in lines if "error" in line.lower() and "-c " not in line), lines[0])
        return f"build failed in {directory}: {type(exc).__name__}: {first_error.strip()}"
    return None


def ensure_loaded() -> bool:
    """Loads the library if not tried yet; True when its ops are registered."""
    with _lock:
        if "reason" not in _state:
            reason = _load()
            _state["reason"] = reason
            if reason is not None:
                log.warning("native CPU kernels unavailable, using torch instead: %s", reason)
    return _state["reason"] is None


def native_available() -> bool:
    return ensure_loaded()


def unavailable_reason() -> str | None:
    """None when the native kernels are loaded, else why not."""
    ensure_loaded()
    return _state["reason"]
