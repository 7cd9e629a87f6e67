"""CuPy access for the kernels: imported lazily (CPU machines have no CuPy), tensors shared by DLPack."""

from __future__ import annotations

import functools

import torch


@functools.cache
def cupy_module():
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


def as_cupy(tensor: torch.Tensor):
    """The same memory as a CuPy array (no copy); the tensor must be contiguous."""
    return cupy_module().from_dlpack(tensor)


def launch(kernel, grid: int, block: int, args: tuple, tensor: torch.Tensor) -> None:
    """Launch on the stream torch is using for this tensor's device, so it orders with torch's work
    (and is captured with it inside a CUDA graph)."""
    cupy = cupy_module()
    stream = torch.cuda.current_stream(tensor.device)
    with cupy.cuda.ExternalStream(stream.cuda_stream):
        kernel((grid,), (block,), args)
