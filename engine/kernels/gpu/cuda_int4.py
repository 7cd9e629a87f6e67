"""GGUF Q4_0 and Q4_1 linear weights kept 4-bit on an NVIDIA GPU, through torch's weight-only int4 kernel.

Built from a QuantizedLinear's ggml rows (engine/model/quantized.py) with the same operands torch's CPU
int4 kernel takes there (engine/kernels/int4_operands.py): per 32-group, a nibble q in 0..15, a scale and a zero, with
    w = (q - 8) * scale + zero:      Q4_0: scale d, zero 0;    Q4_1: scale d, zero m + 8d.
On CUDA (`_weight_int4pack_mm`, read in torch's aten/src/ATen/native/cuda/int4mm.cu) the scales and zeros
are bfloat16 and so are the activations (the kernel checks `A.dtype() == kBFloat16`) and the output:
inputs of another dtype are refused, not converted, so that a model loaded in another dtype fails at its
first call instead of running at a precision nobody asked for (EngineConfig already refuses that
configuration). The kernel dequantizes each weight with one bfloat16 fma, (q - 8) * scale + zero rounded
once, and multiplies on the tensor cores with fp32 accumulation.

Rounding. With u = 2^-8 (bfloat16 keeps 8 significant bits; rounding to nearest moves a value by up to
half a unit in its last place, 2^-8 of it: an fp16 d of 1 + 2^-8 becomes 1), scale = bf16(d),
zero = bf16(m + 8d) (m + 8d summed in fp32 first: exact for any block whose m and 8d are within 2^12 of
each other, else one fp32 rounding more, not counted here) and the served weight
w' = bf16((q - 8) * scale + zero), against gguf's w (d * (q - 8) for Q4_0, d * q + m for Q4_1):
    |w' - w| <= u * |w| + u * (1 + u) * (|q - 8| * |d| + |m + 8d|)      (m + 8d is 0 for Q4_0)
(scale and zero each off by at most u of themselves, then one more rounding of the sum). For Q4_0 that is
(2u + u^2) |w| = (2^-7 + 2^-16) |w|; a Q4_1 weight near 0 (where (q - 8) d and m + 8d cancel) has no
relative bound, only this absolute one. tests/engine/test_cuda_int4.py checks it on random blocks, and
that it is nearly reached; tests/engine/test_cuda_int4_gpu.py derives its output tolerance from it.

Routes, by the input's row count:
    at most MAX_ROWS rows: the int4 kernel. Its grid has one block per 16 rows and 8 output columns, and
        every block dequantizes its slice of the weight again, so its time grows with the rows. Each
        row's sum runs in the same order at any row count (read in the kernel, not measured): on this
        route a row's output does not depend on the rows beside it.
    more: the weight dequantized to bfloat16 on the GPU at each call (`dequantize_int4`: the kernel's
        weights, (q - 8) * scale + zero in fp32, exact but for extreme zeros, rounded once) and F.linear
        (cuBLAS), whose time is nearly flat in the rows up to a few hundred. The bfloat16 copy lives
        for the call only.
The two routes serve the same weights and differ in summation order alone (a near-tie may resolve
differently on either side of MAX_ROWS, as cuBLAS's own shape-chosen kernels already do on a GPU);
tests/engine/test_cuda_int4_gpu.py reads the kernel's weights back through one-hot rows and requires
them equal to dequantize_int4's.

Memory: the module holds the nibbles twice, as the kernel's tile layout (`packed`) and as plain bytes
(`nibbles`, two per byte) that the per-call dequantization reads, and the bf16 scales and zeros: about
1.13 bytes a weight, against 2 for a bfloat16 copy and 0.56 (Q4_0) or 0.63 (Q4_1) in the file. Reading
the weights back out of the tile layout would save the plain copy; the layout is written by a CUDA
kernel this code could not be checked against without a GPU, so the plain bytes are kept.

Packing for the kernel (`_convert_weight_to_int4pack`, torch >= 2.5): uint8 [N, K/2], two nibbles a byte,
element 2j in the high nibble of byte j and element 2j+1 in the low one (torch's test_linalg.py builds it
as `(q[:, ::2] << 4 | q[:, 1::2])`), into int32 [N/8, K/(inner_k_tiles*16), 32, inner_k_tiles/2]; the
kernel takes inner_k_tiles 2, 4 or 8 with K a multiple of inner_k_tiles * 16, and scales_zeros bf16
[K/32, N rounded up to 8, 2].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import gguf
import torch
from torch import nn
from torch.nn import functional as F

from engine.kernels.fused_parts import fused_bias
from engine.kernels.int4_operands import GROUP, kernel_operands

if TYPE_CHECKING:
    from engine.model.quantized import QuantizedLinear

Q = gguf.GGMLQuantizationType
CUDA_TYPES = frozenset({Q.Q4_0, Q.Q4_1})
# Most rows an input may have to go through the int4 kernel; more are dequantized + F.linear. Not measured:
# this was written on a machine without a GPU. Published figures for this kernel (torchao's HQQ README:
# A6000, 4096 x 4096, groups of 128) have it at 0.04 ms for 16 rows, 0.25 for 128 and 0.52 for 256,
# against 0.27-0.33 ms for HQQ's torch reference (dequantize, then matmul): even at about 128 rows there. An H200 has
# six times an A6000's memory bandwidth, which the dequantization is bound by, and only two to three
# times the throughput of the kernel's mma.sync tiles, so the crossover moves down; vLLM's GPTQ route
# (exllama) turns to dequantize + cuBLAS above 50 rows. bench/cuda_int4.py times both routes on a GPU to
# tune it. Keep it a decode-graph bucket (a power of two, engine/decode/graphs.py), so that a batch and
# the bucket its graph replays at take the same route.
MAX_ROWS = 64
INNER_K_TILES = (8, 4, 2)  # the kernel's choices, widest (16-byte loads) first
N_TILE = 8  # the kernel's output-column tile: scales_zeros has a multiple of 8 columns


class CudaInt4Linear(nn.Module):
    """y = x @ W.T (+ bias) for a Q4_0/Q4_1 weight W [out, in] on a CUDA device, bfloat16 in and out.

    `nibbles` uint8 [out, in/2] and `scales_zeros` bfloat16 [in/32, out, 2] (buffers) are the weight;
    `packed`, the kernel's layout of the nibbles, is made by prepare_for_serving (after fusion, so the
    parts of a fused module never hold one) or at the first kernel call."""

    nibbles: torch.Tensor  # buffers, registered in __init__
    scales_zeros: torch.Tensor
    bias: torch.Tensor | None
    packed: torch.Tensor | None
    kernel_scales: torch.Tensor | None

    def __init__(self, nibbles: torch.Tensor, scales_zeros: torch.Tensor, qtype: gguf.GGMLQuantizationType,
                 in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        if qtype not in CUDA_TYPES:
            raise ValueError(f"CudaInt4Linear serves Q4_0 and Q4_1, not {qtype.name}")
        if nibbles.dtype != torch.uint8 or tuple(nibbles.shape[1:]) != (in_features // 2,):
            raise ValueError(f"nibbles must be uint8 [out, {in_features // 2}], "
                             f"got {nibbles.dtype} {tuple(nibbles.shape)}")
        out = nibbles.shape[0]
        if scales_zeros.dtype != torch.bfloat16 or tuple(scales_zeros.shape) != (in_features // GROUP, out, 2):
            raise ValueError(f"scales_zeros must be bfloat16 [{in_features // GROUP}, {out}, 2], got "
                             f"{scales_zeros.dtype} {tuple(scales_zeros.shape)}")
        self.qtype = qtype
        self.in_features = in_features
        self.out_features = out
        self.inner_k_tiles = inner_k_tiles(in_features)
        self.register_buffer("nibbles", nibbles)
        self.register_buffer("scales_zeros", scales_zeros)
        self.register_buffer("bias", bias)
        # Derived from the two above, so not saved; the kernel's scales are scales_zeros itself unless its
        # columns need padding to the kernel's tile or it is a non-contiguous view (a fused part's).
        self.register_buffer("packed", None, persistent=False)
        self.register_buffer("kernel_scales", None, persistent=False)
        self.fused_into_another = False  # its rows serve through a fused module (fuse_cuda_int4)

    @classmethod
    def from_quantized(cls, linear: QuantizedLinear, device: torch.device | str) -> "CudaInt4Linear":
        """The same weight as `linear` (a Q4_0/Q4_1 QuantizedLinear, its rows on the CPU) on `device`, scales
        and zeros rounded to bfloat16. Nothing of `linear` is kept: the caller drops it."""
        if linear.qtype not in CUDA_TYPES:
            raise ValueError(f"CudaInt4Linear serves Q4_0 and Q4_1, not {linear.qtype.name}")
        nibbles, scales_zeros = kernel_operands(linear.raw.numpy(), linear.qtype)  # rows padded to 16
        out = linear.out_features
        nibble_bytes = pack_nibbles(nibbles[:out])
        scales = scales_zeros[:, :out].to(torch.bfloat16).contiguous()  # the one rounding of d and m + 8d
        bias = None if linear.bias is None else linear.bias.to(device)
        return cls(nibble_bytes.to(device), scales.to(device), linear.qtype, linear.in_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cuda":
            raise ValueError(f"CudaInt4Linear runs on CUDA only, got an input on {x.device}")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"CudaInt4Linear takes bfloat16 inputs (torch's CUDA int4 kernel is bfloat16 only), "
                            f"got {x.dtype}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, in]
        if 0 < x2.shape[0] <= MAX_ROWS:  # the kernel cannot launch a grid of no rows
            packed, scales = self.kernel_operands()
            out = torch.ops.aten._weight_int4pack_mm(x2.contiguous(), packed, GROUP, scales)  # [M, out rounded up to 8]
            if out.shape[1] != self.out_features:
                out = out.narrow(1, 0, self.out_features)
        else:
            out = F.linear(x2, self.dequantize())
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*lead, self.out_features)

    def prepare_for_serving(self) -> None:
        """Packs now what the first kernel call would (the model calls this after fusing); a part fused into
        another module never packs."""
        if not self.fused_into_another:
            self.kernel_operands()

    def kernel_operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's packed weight and its scales_zeros, made on first use."""
        if self.packed is None or self.kernel_scales is None:
            # Rows padded to the kernel's tile with scale and zero 0 (weight 0, sliced off the output). The
            # CUDA op would pad the nibbles itself, but torch's meta kernel rounds their rows down.
            padding = -self.out_features % N_TILE
            nibbles = F.pad(self.nibbles, (0, 0, 0, padding)) if padding else self.nibbles
            scales = F.pad(self.scales_zeros, (0, 0, 0, padding)) if padding else self.scales_zeros
            self.packed = torch.ops.aten._convert_weight_to_int4pack(nibbles.contiguous(), self.inner_k_tiles)
            self.kernel_scales = scales.contiguous()  # itself, unless a fused part's view or padded
        return self.packed, self.kernel_scales

    def dequantize(self) -> torch.Tensor:
        """[out, in] bfloat16: the weights the kernel computes with (module docstring), on the module's device."""
        return dequantize_int4(self.nibbles, self.scales_zeros)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype.name}, "
                f"bias={self.bias is not None}")


def inner_k_tiles(in_features: int) -> int:
    """The widest of the kernel's inner k-tile counts that divides in_features into its 16-wide k-tiles."""
    for tiles in INNER_K_TILES:
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"in_features {in_features} is not a multiple of {INNER_K_TILES[-1] * 16} (whole 32-blocks)")


def pack_nibbles(nibbles: torch.Tensor) -> torch.Tensor:
    """Nibbles [N, K] (integers in 0..15) -> uint8 [N, K/2] as `_convert_weight_to_int4pack` reads them: the
    even element in the high nibble, the odd one in the low."""
    return ((nibbles[:, ::2] << 4) | nibbles[:, 1::2]).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> uint8 [N, K], the inverse of pack_nibbles."""
    return torch.stack([packed >> 4, packed & 0x0F], dim=-1).view(packed.shape[0], -1)


def dequantize_int4(nibbles: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] and bfloat16 [K/32, N, 2] -> bfloat16 [N, K], on their device (CPU or CUDA alike).

    (q - 8) * scale + zero in fp32, where the product (a 4-bit integer times an 8-bit significand) is
    exact, and so is the sum unless the zero is more than 2^12 times the product, then one rounding to
    bfloat16: the kernel's single-rounding bf16 fma, the same weights. (Where the sum is not exact it is
    rounded twice, which may leave the weight one bf16 unit from the kernel's.) Scratch for the call:
    4 bytes a weight in fp32, beside the 2-byte result."""
    n = nibbles.shape[0]
    groups = scales_zeros.shape[0]
    q = unpack_nibbles(nibbles).view(n, groups, GROUP).float()    # [N, G, 32]
    scale = scales_zeros.select(-1, 0).T.float().unsqueeze(-1)      # [N, G, 1]
    zero = scales_zeros.select(-1, 1).T.float().unsqueeze(-1)
    return q.sub_(8).mul_(scale).add_(zero).to(torch.bfloat16).view(n, -1)


def fuse_cuda_int4(*linears: CudaInt4Linear) -> CudaInt4Linear:
    """One module for several projections of the same input (outputs concatenated in order), as
    fuse_quantized does on the CPU: the parts' nibbles and scales become views of the fused module's, and
    they drop any packed copy (made again should a part itself be called). Call before packing."""
    if not linears:
        raise ValueError("fuse_cuda_int4 needs at least one CudaInt4Linear")
    first, bias = linears[0], fused_bias(linears)
    fused = CudaInt4Linear(torch.cat([linear.nibbles for linear in linears]),
                           torch.cat([linear.scales_zeros for linear in linears], dim=1),
                           first.qtype, first.in_features, bias)
    start = 0
    for linear in linears:
        stop = start + linear.out_features
        linear.nibbles = fused.nibbles[start:stop]
        linear.scales_zeros = fused.scales_zeros[:, start:stop]
        linear.packed = linear.kernel_scales = None
        linear.fused_into_another = True
        start = stop
    return fused
