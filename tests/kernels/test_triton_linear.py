"""The batch-invariant Triton GEMM (engine/kernels/gpu/triton_linear.py): F.linear's result, and each row the
same bits whatever rows share the call. On the CPU under Triton's interpreter (float32), on CUDA compiled
(gpu-marked, float32 and bfloat16 at the 1B Llama's projection shapes, where cuBLAS itself is not invariant).

The interpreter's tl.dot is numpy's matmul of the two tiles, so on the CPU what a row's place within a tile
does to its bits is numpy's BLAS's business, not the kernel's: OpenBLAS's AVX-512 kernels give a row the
same bits at every place, its Haswell kernel (AVX2 machines, and CPUs it does not know yet, which it
treats as Haswell) rounds the rows of its tail block otherwise. There the place test skips, saying so;
the row-count test (the kernel's own part: tiles, k-blocks and order chosen without the row count)
runs everywhere, and the GPU test checks both.

Against F.linear within 1e-4 absolute and 1e-5 relative in float32 (the sums are the same products in
another order); against itself, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

from engine.kernels.gpu import triton_linear  # noqa: E402


@pytest.fixture
def kernel():
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the compiled kernel is tested on it (the gpu-marked tests)")
    return triton_linear


def operands(rows, out_features, in_features, dtype=torch.float32, device="cpu", seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=g).to(dtype).to(device)
    weight = (torch.randn(out_features, in_features, generator=g) / in_features ** 0.5).to(dtype).to(device)
    b = torch.randn(out_features, generator=g).to(dtype).to(device) if bias else None
    return x, weight, b


# Shapes off the tiles' multiples (the tails masked) and on them; K over several k-blocks.
@pytest.mark.parametrize("rows, out_features, in_features", [(1, 48, 64), (7, 100, 200), (33, 64, 72), (70, 130, 96)])
@pytest.mark.parametrize("bias", [True, False])
def test_against_f_linear(kernel, rows, out_features, in_features, bias):
    x, weight, b = operands(rows, out_features, in_features, seed=rows + out_features, bias=bias)
    got = kernel.invariant_linear(x, weight, b)
    assert got.shape == (rows, out_features) and got.dtype == x.dtype
    torch.testing.assert_close(got, F.linear(x, weight, b), atol=1e-4, rtol=1e-5)


def test_a_row_is_the_same_bits_at_every_row_count(kernel):
    """Prefixes that end inside, at and past a tile's edge: each row is the bits it has among all 70."""
    x, weight, b = operands(70, 130, 200, seed=5)
    everything = kernel.invariant_linear(x, weight, b)
    for count in (1, 2, 31, 32, 33, 64, 69):
        assert torch.equal(kernel.invariant_linear(x[:count], weight, b), everything[:count]), count


def numpy_matmul_keeps_a_rows_bits_at_every_place(config: triton_linear.TileConfig) -> bool:
    """Whether this machine's numpy gives a row of an x tile times a weight tile the same bits wherever
    the row sits in its tile (a row alone at the top, and the rows reversed)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((config.block_m, config.block_k), dtype=np.float32)
    w = rng.standard_normal((config.block_k, config.block_n), dtype=np.float32)
    full = np.matmul(x, w)
    alone = np.zeros_like(x)
    alone[0] = x[-1]
    return np.array_equal(np.matmul(alone, w)[0], full[-1]) and np.array_equal(np.matmul(x[::-1], w), full[::-1])


def test_a_row_is_the_same_bits_at_every_place(kernel):
    """Rows alone and shuffled, moved to other places within a tile: each is the bits it has among all 70."""
    x, weight, b = operands(70, 130, 200, seed=5)
    if not numpy_matmul_keeps_a_rows_bits_at_every_place(kernel.tile_config(130, 200)):
        pytest.skip("this machine's numpy BLAS (the interpreter's tl.dot) rounds a row by its place in the tile "
                    "(OpenBLAS's AVX2 kernel, Haswell); the GPU test checks the place")
    everything = kernel.invariant_linear(x, weight, b)
    for row in (0, 5, 31, 32, 69):
        assert torch.equal(kernel.invariant_linear(x[row:row + 1], weight, b), everything[row:row + 1]), row
    shuffled = torch.randperm(70, generator=torch.Generator().manual_seed(1))
    assert torch.equal(kernel.invariant_linear(x[shuffled], weight, b), everything[shuffled])


def test_leading_dimensions_and_strided_rows(kernel):
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(2, 3, 150, generator=g)
    x = wide[..., :96]                                   # rows strided by 150
    weight = torch.randn(300, 96, generator=g)[::2]      # a weight whose rows are strided (a fused part is not)
    got = kernel.invariant_linear(x, weight)
    assert not x.is_contiguous() and got.shape == (2, 3, 150)
    torch.testing.assert_close(got, F.linear(x, weight), atol=1e-4, rtol=1e-5)
    assert kernel.invariant_linear(x[:0], weight).shape == (0, 3, 150)


def test_mismatched_operands_are_refused():
    with pytest.raises(ValueError, match="share one of"):
        triton_linear.invariant_linear(torch.zeros(2, 8), torch.zeros(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="share one of"):
        triton_linear.invariant_linear(torch.zeros(2, 8), torch.zeros(4, 8), torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="do not fit"):
        triton_linear.invariant_linear(torch.zeros(2, 8), torch.zeros(4, 6))
    with pytest.raises(ValueError, match="do not fit"):
        triton_linear.invariant_linear(torch.zeros(2, 8), torch.zeros(4, 8), torch.zeros(3))


# The 1B Llama's projections (q/k/v fused, o, gate/up fused, down) and a head of 32,000.
SHAPES_1B = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (32000, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features, in_features", SHAPES_1B)
def test_on_cuda_rows_keep_their_bits_where_f_linear_does_not_promise_it(dtype, out_features, in_features):
    x, weight, b = operands(512, out_features, in_features, dtype=dtype, device="cuda", seed=out_features)
    everything = triton_linear.invariant_linear(x, weight, b)
    for count in (1, 3, 8, 64, 200):
        assert torch.equal(triton_linear.invariant_linear(x[:count], weight, b), everything[:count]), count
    for row in (5, 31, 200):  # alone: at the top of its tile
        assert torch.equal(triton_linear.invariant_linear(x[row:row + 1], weight, b), everything[row:row + 1]), row
    shuffled = torch.randperm(512, generator=torch.Generator().manual_seed(1)).to(x.device)
    assert torch.equal(triton_linear.invariant_linear(x[shuffled], weight, b), everything[shuffled])
    tolerance = {torch.float32: (1e-3, 1e-4), torch.bfloat16: (3e-2, 2e-2)}[dtype]
    torch.testing.assert_close(everything, F.linear(x, weight, b), atol=tolerance[0], rtol=tolerance[1])
