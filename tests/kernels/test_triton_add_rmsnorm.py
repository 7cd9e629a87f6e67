"""The fused residual add + RMSNorm kernel (engine/kernels/gpu/triton_add_rmsnorm.py) against the module path
it stands for in a decoder layer (engine/model/llama.py: `x = x + sublayer(...)`, then the RMSNorm module of
engine/model/layers.py), on the CPU under Triton's interpreter.

float32, hidden sizes 64, 128, 576 (not a power of two: the tail masked) and odd row counts: the sum is
the same bits (one rounding either way), the normed rows within 2e-6 absolute and relative (the kernel's
mean of squares sums in another order than torch's). bfloat16 on a GPU only (the gpu-marked test): Triton
3.9's interpreter truncates float32 to bfloat16 (even with fp_downcast_rounding="rtne") where compiled
code and torch round to nearest even, so there even the sum comes out different.
"""

from __future__ import annotations


import pytest
import torch

from engine.model.layers import RMSNorm
from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

from engine.kernels.gpu import triton_add_rmsnorm  # noqa: E402

TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 1e-2}


@pytest.fixture
def kernel():
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the compiled kernel is tested on it (test_on_cuda_against_the_module_path)")
    return triton_add_rmsnorm


def module_path(x, residual, norm):
    total = residual + x
    return norm(total), total


def check(kernel, rows, hidden, dtype=torch.float32, device="cpu", seed=0, eps=1e-6):
    g = torch.Generator().manual_seed(seed)
    # A residual stream larger than the sublayer's output, as in a model; weights away from 1.
    x = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
    residual = (torch.randn(rows, hidden, generator=g) * 4).to(dtype).to(device)
    norm = RMSNorm(hidden, eps).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=g) * 2 - 0.5)
        normed, total = kernel.add_rmsnorm(x, residual, norm.weight, eps)
        expected_normed, expected_total = module_path(x, residual, norm)
    assert normed.dtype == expected_normed.dtype and total.dtype == expected_total.dtype
    assert torch.equal(total, expected_total)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(normed, expected_normed, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("hidden", [64, 128, 576])
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_against_the_module_path(kernel, rows, hidden):
    check(kernel, rows, hidden, seed=rows * 1000 + hidden)


@pytest.mark.parametrize("rows, hidden", [(1, 64), (7, 576), (33, 128)])
def test_the_norm_alone_against_the_module(kernel, rows, hidden):
    """rmsnorm: the same kernel with no residual (q/k norms, a first layer's input norm, Gemma's sandwich
    norms), against the RMSNorm module, and its input left as it was."""
    g = torch.Generator().manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, generator=g) * 3
    before = x.clone()
    norm = RMSNorm(hidden, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=g) * 2 - 0.5)
        normed = kernel.rmsnorm(x, norm.weight, 1e-6)
        expected = norm(x)
    assert torch.equal(x, before) and normed.shape == x.shape
    torch.testing.assert_close(normed, expected, atol=2e-6, rtol=2e-6)


def test_epsilon_matters_where_rows_are_small(kernel):
    """Rows of tiny values: there eps dominates the mean of squares, so a kernel that dropped it (or used
    another) would differ by orders of magnitude, not in the last bits."""
    g = torch.Generator().manual_seed(3)
    x, residual = torch.randn(5, 64, generator=g) * 1e-4, torch.randn(5, 64, generator=g) * 1e-4
    norm = RMSNorm(64, 1e-5)
    with torch.no_grad():
        normed, _ = kernel.add_rmsnorm(x, residual, norm.weight, 1e-5)
        expected, _ = module_path(x, residual, norm)
    torch.testing.assert_close(normed, expected, atol=2e-6, rtol=2e-6)


def test_leading_dimensions_and_strided_rows(kernel):
    """[B, T, hidden] as a training-shaped call gives, and rows that are a view into a wider tensor."""
    g = torch.Generator().manual_seed(4)
    wide = torch.randn(2, 3, 200, generator=g)
    x, residual = wide[..., :128], torch.randn(2, 3, 128, generator=g)
    assert not x.is_contiguous()
    norm = RMSNorm(128, 1e-6)
    with torch.no_grad():
        normed, total = kernel.add_rmsnorm(x, residual, norm.weight, 1e-6)
        expected_normed, expected_total = module_path(x, residual, norm)
    assert normed.shape == x.shape and torch.equal(total, expected_total)
    torch.testing.assert_close(normed, expected_normed, atol=2e-6, rtol=2e-6)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="differ"):
        triton_add_rmsnorm.add_rmsnorm(torch.zeros(2, 64), torch.zeros(3, 64), torch.ones(64), 1e-6)
    with pytest.raises(ValueError, match="hidden size"):
        triton_add_rmsnorm.add_rmsnorm(torch.zeros(2, 64), torch.zeros(2, 64), torch.ones(32), 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_against_the_module_path(dtype):
    for rows, hidden in ((1, 576), (33, 4096)):
        check(triton_add_rmsnorm, rows, hidden, dtype=dtype, device="cuda", seed=rows)
    x = torch.randn(33, 4096, device="cuda").to(dtype)
    weight = torch.rand(4096, device="cuda").to(dtype) + 0.5
    norm = RMSNorm(4096, 1e-6).to(device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        tolerance = TOLERANCE[dtype]
        torch.testing.assert_close(triton_add_rmsnorm.rmsnorm(x, weight, 1e-6), norm(x), atol=tolerance, rtol=tolerance)
        assert torch.equal(triton_add_rmsnorm.rmsnorm(x[:1], weight, 1e-6), triton_add_rmsnorm.rmsnorm(x, weight, 1e-6)[:1])
