"""CuPy access for the kernels: imported lazily (CPU machines have no CuPy), each kernel's CUDA source
with the launch contract its C signature states, and tensors shared by DLPack on torch's stream.

Every launch is checked against its kernel's signature before it reaches the device (a pointer is a
contiguous tensor of the pointee's dtype on the launch device, a scalar a numpy scalar of its exact C
type): a wrong dtype would reinterpret memory, and a non-contiguous output would be written through a
copy nobody reads. Tests swap `launcher` for a recording one, so the contracts are checked on the CPU.

Every kernel is compiled when an engine starts on a CUDA device (`compile_for`), not at its first
launch: a machine whose CuPy cannot load NVRTC (a CuPy wheel without the CUDA toolkit's compiler) would
otherwise start, then fail every row of the first device-loop burst. It fails at start instead, with
one error that names the package to install.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Callable, NoReturn, Protocol

import numpy
import torch

# C type -> the torch dtype a pointer to it must carry, and the numpy scalar a value of it must be.
POINTEE_DTYPES = {"float": torch.float32, "long long": torch.int64, "int": torch.int32}
SCALAR_TYPES = {"long long": numpy.int64, "int": numpy.int32}


class KernelContractError(TypeError):
    """A launch whose grid, block or arguments do not match the kernel's signature."""


class NvrtcMissingError(RuntimeError):
    """CuPy is installed and sees the GPU but cannot load NVRTC, which compiles its kernels."""


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str
    pointer: bool


def parse_signature(source: str, name: str) -> tuple[Param, ...]:
    match = re.search(rf'extern "C" __global__ void {name}\(([^)]*)\)', source)
    if match is None:
        raise ValueError(f'no extern "C" __global__ void {name}(...) in its source')
    params = []
    for text in match.group(1).split(","):
        words = text.replace("*", " * ").split()
        pointer = "*" in words
        words = [w for w in words if w not in ("const", "*", "__restrict__")]
        params.append(Param(words[-1], " ".join(words[:-1]), pointer))
    return tuple(params)


class CudaKernel:
    """One CUDA kernel: its source (compiled by CuPy's NVRTC on first launch) and launch contract.
    `threads`, where given, is the only block size the kernel works with (its shared arrays' size)."""

    def __init__(self, name: str, source: str, threads: int | None = None) -> None:
        self.name, self.source, self.threads = name, source, threads
        self.params = parse_signature(source, name)
        KERNELS.append(self)

    def check(self, grid: int, block: int, args: tuple, device: torch.device) -> None:
        def refuse(why: str) -> NoReturn:
            raise KernelContractError(f"{self.name}: {why}")

        if not (isinstance(grid, int) and grid >= 1 and isinstance(block, int) and 1 <= block <= 1024):
            refuse(f"grid {grid!r} and block {block!r} must be ints, grid >= 1, block in 1..1024")
        if self.threads is not None and block != self.threads:
            refuse(f"block {block} but the kernel is written for {self.threads} threads")
        if len(args) != len(self.params):
            refuse(f"{len(args)} arguments for {len(self.params)} parameters")
        for param, arg in zip(self.params, args):
            if param.pointer:
                expected = POINTEE_DTYPES[param.ctype]
                if not isinstance(arg, torch.Tensor) or arg.dtype != expected:
                    refuse(f"{param.name} must be a {expected} tensor, got {getattr(arg, 'dtype', type(arg))}")
                if not arg.is_contiguous():
                    refuse(f"{param.name} must be contiguous (the kernel indexes it densely)")
                if arg.device != device:
                    refuse(f"{param.name} is on {arg.device}, the launch on {device}")
            elif type(arg) is not SCALAR_TYPES[param.ctype]:
                refuse(f"{param.name} must be a numpy.{SCALAR_TYPES[param.ctype].__name__}, got {type(arg).__name__}")

    def launch(self, grid: int, block: int, args: tuple, device: torch.device) -> None:
        self.check(grid, block, args, device)
        launcher(self, grid, block, args, device)


# Every CudaKernel made (each kernel module makes its own at import): what compile_for compiles.
KERNELS: list[CudaKernel] = []


@functools.cache
def cupy_module() -> ModuleType | None:
    """The cupy module, or None where it is not installed or sees no GPU."""
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # the CUDA runtime raises its own error types when no driver is present
        return None


def use_cupy(*tensors: torch.Tensor) -> bool:
    return all(t.is_cuda for t in tensors) and cupy_module() is not None


def _cupy() -> ModuleType:
    """cupy_module() where a launch needs it: only after use_cupy() said yes."""
    cupy = cupy_module()
    if cupy is None:
        raise RuntimeError("a CuPy launch where CuPy is not usable (use_cupy() is False)")
    return cupy


class RawKernel(Protocol):
    """What this module uses of a cupy.RawKernel."""

    def __call__(self, grid: tuple[int], block: tuple[int], args: tuple) -> None: ...

    def compile(self) -> None: ...


@functools.cache
def _compiled(kernel: CudaKernel) -> RawKernel:
    """The kernel's cupy.RawKernel, compiled by NVRTC once per process."""
    return _cupy().RawKernel(kernel.source, kernel.name)


def compile_for(device: torch.device) -> int:
    """Compile every kernel for `device` now, if it is a CUDA device CuPy can use; returns how many were
    compiled (none on a CPU, or without CuPy, where the torch references run). NVRTC that does not load
    raises NvrtcMissingError; a source that does not compile raises CuPy's own error, unchanged."""
    if device.type != "cuda" or cupy_module() is None:
        return 0
    cupy = _cupy()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cupy.cuda.Device(index):
        for kernel in KERNELS:
            try:
                _compiled(kernel).compile()
            except Exception as exc:
                if _is_nvrtc_missing(exc):
                    raise NvrtcMissingError(nvrtc_missing_message(exc, cupy.__version__, torch.version.cuda)) from exc
                raise
    return len(KERNELS)


def _is_nvrtc_missing(exc: BaseException) -> bool:
    """A failure to load the NVRTC library (CuPy: "CuPy failed to load libnvrtc.so.13: OSError: ..."),
    as opposed to a source NVRTC refused, whose log also names NVRTC."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    compile_errors = ("CompileException", "NVRTCError")
    return (not any(type(e).__name__ in compile_errors for e in chain)
            and any("nvrtc" in str(e).lower() for e in chain))


def nvrtc_missing_message(exc: BaseException, cupy_version: str, torch_cuda: str | None) -> str:
    """The one error a machine without NVRTC gets at start: what failed, and the package that brings it
    for the CUDA version torch was built for (CuPy's `ctk` extra installs the toolkit's NVRTC wheel)."""
    major = (torch_cuda or "").split(".")[0]
    package = f'"cupy-cuda{major}x[ctk]"' if major.isdigit() else 'the CuPy built for your CUDA, with its [ctk] extra'
    return (f"CuPy {cupy_version} cannot load NVRTC, which compiles the device loop's kernels ({exc}). "
            f"torch here is built for CUDA {torch_cuda}: install {package} (or nvidia-cuda-nvrtc for "
            f"CUDA {major or 'that version'}), or uninstall CuPy to run the torch kernels instead.")


class _StreamHandle:
    """A raw cudaStream_t in the CUDA stream protocol, which CuPy 14's Stream.from_external reads."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


def _torch_stream(cupy: ModuleType, device: torch.device) -> AbstractContextManager[object]:
    """torch's current stream on `device` as a cupy stream (a context manager that makes it current)."""
    handle = torch.cuda.current_stream(device).cuda_stream
    if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14, where ExternalStream is deprecated
        return cupy.cuda.Stream.from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle, device.index if device.index is not None else torch.cuda.current_device())


def cupy_launch(kernel: CudaKernel, grid: int, block: int, args: tuple, device: torch.device) -> None:
    """Launch on the stream torch is using on this device, so the kernel orders with torch's work (and
    is captured with it inside a CUDA graph)."""
    cupy = _cupy()
    with _torch_stream(cupy, device):
        # Inside the stream: from_dlpack orders the hand-over against the current CuPy stream, which
        # outside would be the legacy default stream (a sync that invalidates a capture).
        shared = tuple(cupy.from_dlpack(arg) if isinstance(arg, torch.Tensor) else arg for arg in args)
        _compiled(kernel)((grid,), (block,), shared)


# Replaced by tests with a recording launcher: (kernel, grid, block, args, device) -> None.
launcher: Callable[[CudaKernel, int, int, tuple, torch.device], None] = cupy_launch
