"""A float projection `x @ weight.T + bias` in Triton whose rows are the same bits whatever the row count.

cuBLAS picks its algorithm (tile shape, split-K, the order of a dot product's partial sums) by the
problem's shape, so a row's result changes with how many rows share the call: a decode step at batch 5
and the same step in a graph padded to 8 give a token other logits in the last bits, and a greedy
near-tie then flips. Here one program computes a BLOCK_M x BLOCK_N tile of the output:

    acc[m, n] = sum over k-blocks, in order, of dot(x[m, kb], weight[n, kb])    (float32 accumulation)
    y[m, n]   = round(acc[m, n] + bias[n])                                      (once, to x's dtype)

and the tile sizes, warps and stages come from the weight's shape alone (`tile_config`), never from the
row count: a row's products are the same instructions over the same values in the same order at any
batch, and rows past the end are masked to zero, which changes nobody's sum. No split-K, so no partial
sums meet in an order that could vary. float32 runs in IEEE precision (no TF32), as torch's F.linear does
by default. Runs on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests only).

The price is cuBLAS's choice of the best kernel per shape: bench/gpu_gemm.py prints this kernel's time
against F.linear's at the 1B model's shapes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # F.linear serves where Triton is missing
    triton = None

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class TileConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int


def tile_config(out_features: int, in_features: int) -> TileConfig:
    """The tiles for a weight of this shape. It takes no row count on purpose: that is the invariance.
    Narrow output tiles, so that a projection of a small model at one row still spreads over the GPU's
    multiprocessors (2,048 outputs are 64 programs); a tuned table per shape may replace this, keyed the
    same way."""
    del out_features, in_features  # one config for every shape until a GPU run tunes it
    return TileConfig(block_m=32, block_n=32, block_k=64, warps=4, stages=3)


def available() -> bool:
    return triton is not None


if triton is not None:

    # The row count is not specialised on (Triton would compile apart for 1 and for multiples of 16): one
    # compiled kernel for every batch, none compiled mid-serving.
    @triton.jit(do_not_specialize=["rows"])
    def _linear_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, rows, out_features, in_features,
                       stride_x, stride_w, stride_out,
                       HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        row_ids = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        col_ids = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok, col_ok = row_ids < rows, col_ids < out_features
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, in_features, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            k_ok = ks < in_features
            x = tl.load(x_ptr + row_ids[:, None] * stride_x + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)                # [BLOCK_M, BLOCK_K]
            w = tl.load(weight_ptr + col_ids[None, :] * stride_w + ks[:, None],
                        mask=col_ok[None, :] & k_ok[:, None], other=0.0)                # [BLOCK_K, BLOCK_N]
            if IEEE:
                acc = tl.dot(x, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + col_ids, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + row_ids[:, None] * stride_out + col_ids[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., in_features] and weight [out_features, in_features] of one
    float dtype (DTYPES), each row's result independent of the others."""
    if triton is None:
        raise RuntimeError("the invariant Triton GEMM: the triton package is not installed")
    out_features, in_features = weight.shape
    if x.dtype != weight.dtype or x.dtype not in DTYPES or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"x {x.dtype}, weight {weight.dtype} and bias must share one of {DTYPES}")
    if x.shape[-1] != in_features or (bias is not None and bias.shape != (out_features,)):
        raise ValueError(f"x {tuple(x.shape)}, weight {tuple(weight.shape)} and bias do not fit together")
    rows_in = x.reshape(-1, in_features)  # a view where x's rows are strided alike
    if rows_in.stride(-1) != 1:
        rows_in = rows_in.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out = torch.empty(rows_in.shape[0], out_features, dtype=x.dtype, device=x.device)
    if rows_in.shape[0]:
        tiles = tile_config(out_features, in_features)
        grid = (triton.cdiv(rows_in.shape[0], tiles.block_m), triton.cdiv(out_features, tiles.block_n))
        _linear_kernel[grid](rows_in, weight, bias if bias is not None else weight, out, rows_in.shape[0],
                             out_features, in_features, rows_in.stride(0), weight.stride(0), out.stride(0),
                             HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
                             BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                             num_warps=tiles.warps, num_stages=tiles.stages)
    return out.view(*x.shape[:-1], out_features)
