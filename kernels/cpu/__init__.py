"""Native CPU kernels (C++, built on first use by kernels/cpu/build.py): ggml-quantized matmuls and paged
attention whose rows are bit-identical whatever the batch, the thread count or the SIMD path.
kernels/cpu/qgemm.py and kernels/cpu/paged_attention.py are the API; where `native_available()` is False,
callers use torch."""

from kernels.cpu.build import unavailable_reason
from kernels.cpu.pack import pack
from kernels.cpu.paged_attention import paged_attention
from kernels.cpu.qgemm import cpu_paths, native_available, qgemm, qlinear, quantize_q8_1

__all__ = ["cpu_paths", "native_available", "pack", "paged_attention", "qgemm", "qlinear", "quantize_q8_1",
           "unavailable_reason"]
