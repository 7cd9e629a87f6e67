"""Native CPU kernels (C++, built on first use by engine/kernels/cpu/build.py): ggml-quantized and float matmuls, paged
attention and a fused decoder layer whose rows are bit-identical whatever the batch, the thread count or the SIMD path.
engine/kernels/cpu/qgemm.py and engine/kernels/cpu/paged_attention.py are the API; where `native_available()` is False,
callers use torch."""

from engine.kernels.cpu.build import unavailable_reason
from engine.kernels.cpu.decoder_layer import ACTIVATIONS, LayerWeights, decoder_layer, rms_norm, rope_tables
from engine.kernels.cpu.dense import DTYPES as DENSE_DTYPES, dense_linear
from engine.kernels.cpu.pack import pack
from engine.kernels.cpu.paged_attention import paged_attention
from engine.kernels.cpu.qgemm import cpu_paths, native_available, qgemm, qlinear, quantize_q8_1

__all__ = ["ACTIVATIONS", "DENSE_DTYPES", "LayerWeights", "cpu_paths", "decoder_layer", "dense_linear", "native_available",
           "pack", "paged_attention", "qgemm", "qlinear", "quantize_q8_1", "rms_norm", "rope_tables", "unavailable_reason"]
