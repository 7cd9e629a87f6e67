"""Every CUDA source in engine/kernels/gpu/ compiles with NVRTC for sm_90 (the H200), on this CPU machine.

CuPy's RawKernel compiles with NVRTC and adds no headers, so a source that leans on one (INFINITY,
FLT_MAX) compiles with nvcc and fails only on the first GPU run. NVRTC needs no GPU or driver: the
`nvidia-cuda-nvrtc` wheel (a test dependency) ships the library, loaded here through ctypes.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import engine.kernels.gpu
from engine.kernels.gpu.cupy_support import CudaKernel

ARCH = "sm_90"


def nvrtc_library() -> ctypes.CDLL:
    spec = importlib.util.find_spec("nvidia")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    # The CUDA 13 wheel's layout is nvidia/cu13/lib; the CUDA 12 one's nvidia/cuda_nvrtc/lib.
    found = sorted(p for root in roots for p in root.glob("*/lib/libnvrtc.so*") if "builtins" not in p.name)
    if not found:
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed (the test extra brings it: pip install -e '.[test]')")
    try:
        return ctypes.CDLL(str(found[-1]))
    except OSError as exc:
        pytest.skip(f"libnvrtc from the nvidia-cuda-nvrtc wheel does not load here: {exc}")


def compile_cubin(nvrtc: ctypes.CDLL, source: str, name: str) -> tuple[int, str, bytes]:
    """(nvrtcResult, log, cubin) of compiling `source` as CuPy's RawKernel would, for ARCH."""
    program = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None, None) == 0
    try:
        options = (ctypes.c_char_p * 1)(f"--gpu-architecture={ARCH}".encode())
        result = nvrtc.nvrtcCompileProgram(program, 1, options)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        cubin = b""
        if result == 0:
            nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size))
            buffer = ctypes.create_string_buffer(size.value)
            assert nvrtc.nvrtcGetCUBIN(program, buffer) == 0
            cubin = buffer.raw
        return result, log.value.decode(errors="replace"), cubin
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def kernel_sources() -> list[CudaKernel]:
    """Every CudaKernel in engine/kernels/gpu/; a module with CUDA source but no CudaKernel fails here instead of
    escaping the compile check."""
    found = []
    for info in pkgutil.iter_modules(engine.kernels.gpu.__path__):
        text = (Path(engine.kernels.gpu.__path__[0]) / f"{info.name}.py").read_text()
        if "CudaKernel" not in text and "__global__" not in text:
            continue  # no CUDA source (Triton's, torch's int4 ops), so not imported: some need packages this check does not
        module = importlib.import_module(f"engine.kernels.gpu.{info.name}")
        mine = [value for value in vars(module).values() if isinstance(value, CudaKernel)]
        if re.search(r"__global__ void \w+\(", text):
            assert mine, f"engine/kernels/gpu/{info.name}.py has CUDA source outside a CudaKernel"
        found += mine
    return found


@pytest.fixture(scope="module")
def nvrtc():
    return nvrtc_library()


def test_nvrtc_refuses_what_only_a_header_defines(nvrtc):
    """Liveness control: the compile really runs without headers, so the check below can fail."""
    result, log, _ = compile_cubin(nvrtc, 'extern "C" __global__ void k(float* x) { x[0] = -INFINITY; }', "k")
    assert result != 0 and "INFINITY" in log


def test_every_kernel_source_compiles_for_sm_90(nvrtc):
    sources = kernel_sources()
    assert {k.name for k in sources} >= {"ring_argmax", "commit_token", "fault_word"}
    failures = []
    for kernel in sources:
        result, log, cubin = compile_cubin(nvrtc, kernel.source, kernel.name)
        if result != 0:
            failures.append(f"{kernel.name}: {log.strip()}")
        else:
            assert kernel.name.encode() in cubin, f"{kernel.name}: the cubin has no unmangled entry point"
    assert not failures, "\n".join(failures)
