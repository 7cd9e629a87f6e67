"""GGUF quantized linear weights (Q4_0, Q4_1, Q8_0, and the K-quants) served quantized on the CPU, with
their exact values. (On CUDA the loader serves Q4_0 and Q4_1 from these rows through
engine/kernels/gpu/cuda_int4.py instead, with bfloat16 scales.)

The K-quants (Q4_K, Q5_K, Q6_K, and Q5_1 as Q5_K) arrive re-encoded per 32-block by
engine/loading/transcode.py, which states their row formats; they run on the native kernels only (below,
they have no torch int4 route: without the kernels they are dequantized at each call).

ggml stores a weight row by row, each row a run of 32-element blocks along the input dimension:
    Q4_0: fp16 d, 16 bytes of nibbles q          w = d * (q - 8)
    Q4_1: fp16 d, fp16 m, 16 bytes of nibbles q  w = d * q + m
    Q8_0: fp16 d, 32 int8 q                      w = d * q
(a block's low nibbles are its elements 0-15, its high nibbles 16-31, as in gguf's quants.py).

Two routes, by the activation dtype:
    bfloat16: our native kernels (engine/kernels/cpu, where they are built): the activations quantized per
              32-block to int8 (as llama.cpp does), each block's integer dot product exact and the fp32
              epilogue over the blocks in a fixed order, so a row's output is the same bits whatever the
              batch, the thread count or the SIMD path; the output rounded to bfloat16 once. Where no
              compiler built them, bfloat16 takes the torch route below.
    float32:  torch's int4 kernel below: the exact weights in fp32 arithmetic, the reference route.

torch's CPU weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`, group size 32) computes
w = (q - 8) * scale + zero per group:
    Q4_0: scale d, zero 0.
    Q4_1: scale d, zero m + 8d. Two fp16 values sum exactly in fp32 unless their magnitudes are more
          than 2^12 apart (never for a block's m and 8d in practice), and then the kernel's
          (q - 8) * d + zero is one rounding of d * q + m, as gguf's is: bit for bit the same weight.
    Q8_0: the kernel has no int8 group route (`_weight_int8pack_mm` takes one scale per output row, not
          per 32-group), so each int8 q is split into nibbles, q = 16 * (q >> 4) + (q & 15), and a block
          becomes two int4 groups over the input repeated twice: (high + 8, scale 16d, zero 0) and
          (low, scale d, zero 8d). Both parts are exact, so is their sum; it costs twice a Q4 matmul.

What the kernel does with each activation dtype (read in torch's int4mm_kernel.cpp, measured here):
    bfloat16: vectorized (AVX2/AVX512): Q4 about as fast as F.linear on the fp32 weight, Q8_0 about 2x
              its time (measured); scales and zeros are bfloat16 (d loses its 3 low bits, rounded to
              nearest: weights differ from gguf's by up to 2^-8 relative, as d = 1 + 2^-8 becomes 1)
              and the output is rounded to bfloat16.
    float32:  exact weights and fp32 arithmetic, but on x86 the kernel's generic scalar loop (no SIMD),
              about 10x slower than F.linear on the dequantized weight for one row, and linear in rows.
              So fp32 inputs of more than FP32_KERNEL_MAX_ROWS rows (1 for Q4, 0 for Q8_0) are dequantized
              per call (exactly, as gguf does) and go through F.linear instead: a dequantization per call
              (still 5-10x F.linear alone) but no fp32 copy held between calls. Where fp32 speed matters
              more than memory, give a plain Linear the weight of dequantize() instead.
    float16:  computed in fp32 (the kernel's fp16 path is as slow, and m + 8d need not fit in fp16).
Against x @ gguf.dequantize(W).T in float64, relative to its largest |entry|: float32 outputs within
1e-6 on either route (accumulation order only; up to 9.5e-7 seen at in_features 576), bfloat16 within
5e-3 (tests/engine/test_quantized_linear.py checks 4e-6 and 1.5e-2 at tiny shapes).

The kernel also wants out_features divisible by 16 (rows are padded with zero weights and the output
sliced) and in_features divisible by the group size, which every ggml row of 32-blocks is.

Loading: llama.cpp's converter permutes the rows of Q and K (output features) for its RoPE layout. The
loader undoes that by permuting the raw rows before building the module, `raw[perm]` (numpy fancy
indexing on axis 0): each row is independent, whole blocks along the input dimension.
"""

from __future__ import annotations


import gguf
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from engine.kernels import cpu as cpu_kernels
from engine.kernels.fused_parts import fused_bias
from engine.kernels.int4_operands import GROUP, kernel_operands

Q = gguf.GGMLQuantizationType
# A 32-block's bytes in the rows a QuantizedLinear holds: ggml's own for Q4_0/Q4_1/Q8_0, the transcoder's
# re-encoding for the K-quants (engine/loading/transcode.py).
BLOCK_BYTES = {Q.Q4_0: 2 + 16, Q.Q4_1: 2 + 2 + 16, Q.Q8_0: 2 + 32, Q.Q4_K: 4 + 4 + 16, Q.Q5_K: 4 + 4 + 32,
               Q.Q6_K: 2 + 2 + 32}
# Most rows of a float32 input that go through the int4 kernel; more are dequantized + F.linear. Measured
# on a 2-core AVX2 machine (bench/quantized_linear.py): the scalar fp32 kernel beats dequantize + F.linear
# at one row for Q4, never for Q8_0 (its two int4 groups per block double the kernel's work).
# Held in the transcoder's rows, not the file's, and served by the native kernels only.
K_QUANTS = frozenset({Q.Q4_K, Q.Q5_K, Q.Q6_K})
FP32_KERNEL_MAX_ROWS = {Q.Q4_0: 1, Q.Q4_1: 1, Q.Q8_0: 0}  # the K-quants never: the int4 kernel has no route


class QuantizedLinear(nn.Module):
    """y = x @ W.T (+ bias) for a ggml Q4_0/Q4_1/Q8_0 weight W [out, in], kept quantized. CPU only
    (on CUDA, engine/kernels/gpu/cuda_int4.py's CudaInt4Linear is built from its rows).

    `raw` [out, row_bytes] uint8 (a buffer): the ggml blocks as loaded, what dequantize() and fusion read.
    Derived from it on first use: `native_packed`, the native kernels' layout (`packed()`; None where they
    are not built), and, by the torch route, torch's int4 operands (`_int4`). No dequantized copy is kept."""

    raw: torch.Tensor  # buffers, registered in __init__
    bias: torch.Tensor | None

    def __init__(self, raw: torch.Tensor, qtype: gguf.GGMLQuantizationType, in_features: int,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        self.qtype = qtype
        self.in_features = in_features
        self.out_features = raw.shape[0]
        self.register_buffer("raw", raw)
        # Plain attributes, not buffers: the loader's model.to(bfloat16) must not round the fp32 scales
        # they hold, and the kernels run on the CPU only, so nothing moves them either.
        self._native = cpu_kernels.native_available()
        self.native_packed: torch.Tensor | None = None  # made by `packed`
        self.fused_into_another = False  # its rows serve through a fused module (fuse_quantized)
        self._int4: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.register_buffer("bias", bias)

    @classmethod
    def from_ggml(cls, raw: np.ndarray, qtype: gguf.GGMLQuantizationType | int, in_features: int,
                  bias: torch.Tensor | None = None) -> "QuantizedLinear":
        """From a GGUF tensor's data (`GGUFFile(...).tensors[i].data`, uint8 [out, row_bytes]) and type, or
        for a K-quant from the transcoder's rows. Raises ValueError for other types and for shapes that are not whole blocks."""
        shape = tuple(np.shape(raw))
        try:
            qtype = Q(qtype)
        except ValueError:
            raise ValueError(f"unknown ggml type {qtype!r} for a tensor of shape {shape}") from None
        if qtype not in BLOCK_BYTES:
            raise ValueError(f"QuantizedLinear supports Q4_0, Q4_1, Q8_0 and transcoded Q4_K, Q5_K, Q6_K, "
                             f"not {qtype.name} (tensor of shape {shape})")
        dtype = np.asarray(raw).dtype
        if len(shape) != 2 or dtype != np.uint8:
            raise ValueError(f"{qtype.name} data must be uint8 [out, row_bytes], got {dtype} {shape}")
        if in_features <= 0 or in_features % GROUP:
            raise ValueError(f"{qtype.name} rows are blocks of {GROUP}: in_features {in_features} is not a "
                             f"multiple (tensor of shape {shape})")
        row_bytes = in_features // GROUP * BLOCK_BYTES[qtype]
        size, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
        if qtype in K_QUANTS and shape[1] == in_features // size * type_bytes:
            raise ValueError(f"{qtype.name} rows as the file stores them (shape {shape}): re-encode them first "
                             f"(engine.loading.transcode.transcoded)")
        if shape[1] != row_bytes:
            raise ValueError(f"{qtype.name} with in_features {in_features} has {row_bytes} bytes a row, "
                             f"the tensor has shape {shape}")
        if bias is not None and tuple(bias.shape) != (shape[0],):
            raise ValueError(f"bias of shape {tuple(bias.shape)} for {shape[0]} output features")
        # A copy: the loader's rows are a read-only view of the mapped file.
        return cls(torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)), qtype, in_features,
                   None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise ValueError(f"QuantizedLinear runs on the CPU only, got an input on {x.device}")
        if x.dtype == torch.float16:
            return self.forward(x.float()).half()
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"QuantizedLinear takes float32, bfloat16 or float16 inputs, got {x.dtype}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, in]
        packed = self.packed() if x.dtype == torch.bfloat16 else None
        if packed is not None:
            out = cpu_kernels.qlinear(x2.contiguous(), packed, int(self.qtype), self.out_features,
                                      out_dtype=torch.bfloat16)
        elif self.qtype in K_QUANTS:  # without the native kernels: no int4 route, dequantized (slow, exact)
            out = F.linear(x2, self.dequantize().to(x2.dtype))
        elif x.dtype == torch.float32 and x2.shape[0] > FP32_KERNEL_MAX_ROWS[self.qtype]:
            out = F.linear(x2, self.dequantize())
        else:
            out = self._kernel(x2.contiguous())
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*lead, self.out_features)

    def prepare_for_serving(self) -> None:
        """Packs now what the forward would pack on its first call (the model calls this after fusing,
        so a first request does not wait for it); a part fused into another module never packs."""
        if not self.fused_into_another:
            self.packed()

    def packed(self) -> torch.Tensor | None:
        """The weight in the native kernels' layout, made on first use; None where the native kernels
        are not built."""
        if self.native_packed is None and self._native:
            self.native_packed = cpu_kernels.pack(self.raw, int(self.qtype), self.in_features)
        return self.native_packed

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        """[M, in] contiguous float32/bfloat16 -> [M, out] through the int4 kernel."""
        if self.qtype == Q.Q8_0:  # each block's inputs twice: once for the high nibbles, once the low
            blocks = x2.view(x2.shape[0], -1, 1, GROUP)  # [M, in/32, 1, 32]
            x2 = blocks.expand(-1, -1, 2, -1).reshape(x2.shape[0], 2 * self.in_features)
        packed, scales_zeros, scales_zeros_bf16 = self._int4_operands()
        scales = scales_zeros if x2.dtype == torch.float32 else scales_zeros_bf16
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, packed, GROUP, scales)
        return out if packed.shape[0] == self.out_features else out[:, : self.out_features]

    def _int4_operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """torch's int4 kernel's packed weight and its fp32 and bf16 scales, made once, on first use:
        a model served through the native kernels in bfloat16 never holds them."""
        if self._int4 is None:
            nibbles, scales_zeros = kernel_operands(self.raw.numpy(), self.qtype)
            # innerKTiles only matters for the CUDA layout; the CPU op ignores it.
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1)
            self._int4 = (packed, scales_zeros, scales_zeros.to(torch.bfloat16))
        return self._int4

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32, equal to gguf.quants.dequantize of the raw data (same formulas, same order)."""
        return dequantize_rows(self.raw, self.qtype, self.in_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype.name}, "
                f"bias={self.bias is not None}")


def dequantize_rows(raw: torch.Tensor, qtype: gguf.GGMLQuantizationType, in_features: int) -> torch.Tensor:
    """Rows uint8 [..., row_bytes] -> float32 [..., in_features], gguf's formulas in gguf's order (for the
    K-quants, of the file's rows they were transcoded from)."""
    lead = raw.shape[:-1]
    blocks = raw.reshape(*lead, -1, BLOCK_BYTES[qtype])                      # [..., in/32, bytes]
    if qtype in (Q.Q4_K, Q.Q5_K):
        d, m = blocks[..., 0:4].contiguous().view(torch.float32), blocks[..., 4:8].contiguous().view(torch.float32)
        q = _nibbles(blocks[..., 8:]) if qtype == Q.Q4_K else blocks[..., 8:]
        return (d * q.float() + m).reshape(*lead, in_features)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()            # [..., in/32, 1]
    if qtype == Q.Q6_K:  # (d * sc) * q, each 16-half with its own sc
        scaled = d * blocks[..., 2:4].contiguous().view(torch.int8).float()   # [..., in/32, 2]
        q = blocks[..., 4:].contiguous().view(torch.int8).float()
        return (scaled.repeat_interleave(16, dim=-1) * q).reshape(*lead, in_features)
    if qtype == Q.Q8_0:
        w = blocks[..., 2:].contiguous().view(torch.int8).float() * d
    else:
        q = _nibbles(blocks[..., -16:])                                       # [..., in/32, 32]
        if qtype == Q.Q4_0:
            w = d * (q.float() - 8)
        else:
            m = blocks[..., 2:4].contiguous().view(torch.float16).float()
            w = d * q.float() + m
    return w.reshape(*lead, in_features)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """ggml's 16 nibble bytes [..., 16] -> q [..., 32]: low nibbles elements 0-15, high 16-31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def fuse_quantized(*linears: QuantizedLinear) -> QuantizedLinear:
    """One module for several projections of the same input (outputs concatenated in order), so q/k/v or
    gate/up run as one matmul, as fuse_linears does for float weights: the parts' ggml rows become views
    of the fused module's. Its packed layout is blocked across rows, so it has its own, and the parts
    drop theirs; the caller keeps the fused module for the forward."""
    if not linears:
        raise ValueError("fuse_quantized needs at least one QuantizedLinear")
    first, bias = linears[0], fused_bias(linears)
    fused = QuantizedLinear(torch.cat([linear.raw for linear in linears]), first.qtype, first.in_features, bias)
    # The parts keep their names and values as views into the fused rows, and give up any packed copy
    # (made again should a part itself be called): the model holds each weight once in each form.
    start = 0
    for linear in linears:
        linear.raw = fused.raw[start: start + linear.out_features]
        linear.native_packed = None
        linear.fused_into_another = True
        start += linear.out_features
    return fused
