"""The native dense float GEMM (engine/kernels/cpu/dense.py): y = x @ W.T + b for float32, bfloat16 and
float16 weights.

Bit for bit against an emulation of the arithmetic dense_gemm.h writes out (on integer-valued inputs, where
float64 holds every intermediate exactly, so each emulated step rounds to fp32 exactly once, as an fma does),
on every path this CPU runs; and bit for bit against itself: a row alone or in any batch, one thread or two.
Skipped as a whole where the library cannot be built (engine/kernels/cpu/build.py gives the reason).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernels import cpu

pytestmark = pytest.mark.usefixtures("native_cpu_kernels", "path_on_this_cpu")

PATHS = ["scalar", "avx2", "avx512"]  # by name: only the built library knows which this CPU runs (path_on_this_cpu)
WEIGHT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def emulated(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> np.ndarray:
    """dense_gemm.h's order in numpy: 16 lane sums over k, each fma one fp32 rounding of an exact float64
    value (exact only for inputs whose every partial sum float64 holds: integers well under 2^53)."""
    xs, ws = x.double().numpy(), w.double().numpy()
    m, k = xs.shape
    out = np.empty((m, ws.shape[0]), dtype=np.float32)
    for i in range(m):
        lanes = np.zeros((ws.shape[0], 16), dtype=np.float32)
        for kk in range(k):
            lanes[:, kk % 16] = (xs[i, kk] * ws[:, kk] + lanes[:, kk % 16].astype(np.float64)).astype(np.float32)
        h = 8
        while h >= 1:
            lanes[:, :h] = (lanes[:, :h].astype(np.float64) + lanes[:, h:2 * h]).astype(np.float32)
            h //= 2
        y = lanes[:, 0]
        if bias is not None:
            y = (y.astype(np.float64) + bias.double().numpy()).astype(np.float32)
        out[i] = y
    return out


def integer_inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x in [-65536, 65536] and w in [-255, 255] (exact in every weight dtype): the lane sums pass 2^24, so
    fp32 rounds them and the order of the arithmetic shows in the result."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-65536, 65537, (m, k), generator=g).float()
    w = torch.randint(-255, 256, (n, k), generator=g).float()
    bias = torch.randint(-2 ** 20, 2 ** 20, (n,), generator=g).float() + 0.5
    return x, w, bias


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("wdtype", WEIGHT_DTYPES)
@pytest.mark.parametrize("k", [16, 200])  # 200: a tail of 8 past the last full 16
def test_every_path_computes_the_written_arithmetic_bit_for_bit(path, wdtype, k):
    x, w, bias = integer_inputs(6, 11, k, seed=k)
    want = emulated(x, w, bias)
    got = cpu.dense_linear(x, w.to(wdtype), bias, path=path)
    assert np.array_equal(got.numpy(), want), f"{path} {wdtype}: differs from dense_gemm.h's order"
    sequential = (x.double() @ w.double().T + bias.double()).float()
    assert not torch.equal(got, sequential), "liveness: fp32 rounding made the order visible"


def test_the_lane_order_is_the_one_written_down():
    """A row that a sequential sum gives 1 and the 16 lane sums give 0: lane 0 holds 2^24 then adds 1 (lost to
    rounding), lane 1 holds -2^24, and the tree cancels them."""
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 16], w[0, 1] = 2.0 ** 24, 1.0, -(2.0 ** 24)
    x = torch.ones(1, 32)
    for path in cpu.cpu_paths():
        assert cpu.dense_linear(x, w, path=path).item() == 0.0, path
    assert (x.double() @ w.double().T).item() == 1.0


def test_the_tail_leaves_the_lanes_past_k_alone_a_negative_zero_included():
    """Every product rounds to -0.0 (far below the smallest subnormal), so every lane sum is -0.0 and so is
    their tree; the tail's lanes past K must keep theirs (an fma with zeros there would make them +0.0)."""
    x = torch.full((1, 20), -1e-30)  # K = 20: a tail of 4
    w = torch.full((3, 20), 1e-30)
    for path in cpu.cpu_paths():
        out = cpu.dense_linear(x, w, path=path)
        assert (out == 0).all() and torch.signbit(out).all(), f"{path}: {out}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.bfloat16), (torch.float16, torch.float16)])
def test_a_row_is_the_same_bits_alone_in_any_batch_with_any_thread_count(path, dtypes):
    xdtype, wdtype = dtypes
    g = torch.Generator().manual_seed(7)
    k, n = 200, 67  # a K tail, and columns past the last full tile
    w = (torch.randn(n, k, generator=g) / 8).to(wdtype)
    bias = torch.randn(n, generator=g).to(wdtype)
    x = torch.randn(257, k, generator=g).to(xdtype)
    alone = torch.cat([cpu.dense_linear(x[i:i + 1], w, bias, path=path) for i in range(x.shape[0])])
    assert alone.dtype == xdtype
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            for rows in [1, 3, 8, 64, 257]:
                batch = cpu.dense_linear(x[:rows], w, bias, path=path)
                assert torch.equal(batch, alone[:rows]), f"{rows} rows on {count} threads"
    finally:
        torch.set_num_threads(threads)
    want = x.double() @ w.double().T + bias.double()
    tolerance = 1e-5 if xdtype == torch.float32 else 1e-2
    assert torch.allclose(alone.double(), want, rtol=tolerance, atol=tolerance * want.abs().max().item())


def test_leading_dimensions_are_kept_and_empty_inputs_answer_empty():
    w = torch.randn(5, 32)
    assert cpu.dense_linear(torch.randn(2, 3, 32), w).shape == (2, 3, 5)
    assert cpu.dense_linear(torch.randn(0, 32), w).shape == (0, 5)


@pytest.mark.parametrize("x, w, bias, message", [
    (torch.randn(2, 32), torch.randn(4, 31), None, "x must be"),
    (torch.randn(2, 32).double(), torch.randn(4, 32), None, "float32, bfloat16 or float16"),
    (torch.randn(2, 32), torch.randn(4, 32).int(), None, "float32, bfloat16 or float16"),
    (torch.randn(2, 32), torch.randn(4, 32), torch.randn(5), "bias must be"),
])
def test_bad_operands_are_refused_with_the_reason(x, w, bias, message):
    with pytest.raises((ValueError, TypeError), match=message):
        cpu.dense_linear(x, w, bias)
