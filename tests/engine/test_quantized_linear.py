"""QuantizedLinear against gguf's own quantize/dequantize: exact weights, forward within the stated float
tolerance on both routes (int4 kernel, dequantize + F.linear), fusion, row permutation, and refusals.

Weights are random, quantized by `gguf.quants.quantize`; the reference is x @ gguf.quants.dequantize(W).T
in float64. Shapes are tiny but not kernel-friendly on purpose: out_features 40 is not a multiple of the
kernel's 16 (padded rows), in_features 96 is three blocks.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.model import quantized
from engine.model.quantized import QuantizedLinear, fuse_quantized

Q = gguf.GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]
SHAPES = [(48, 64), (40, 96)]  # [out, in]
# Relative to max |reference|: fp32 is seen within ~7e-7 (accumulation order), bf16 within ~5e-3 (bf16
# inputs, scales and outputs). A wrong nibble order or scale gives errors of order 1.
FP32_TOL, BF16_TOL = 4e-6, 1.5e-2


def ggml_weight(qtype: Q, out: int, inp: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw uint8 [out, row_bytes], gguf's float32 dequantization [out, in]) of a random weight."""
    weight = np.random.default_rng(seed).standard_normal((out, inp)).astype(np.float32)
    raw = gguf.quants.quantize(weight, qtype)
    return raw, gguf.quants.dequantize(raw, qtype)


def assert_close(actual: torch.Tensor, reference: torch.Tensor, tol: float) -> None:
    error = (actual.double() - reference).abs().max().item()
    assert error <= tol * reference.abs().max().item(), f"max error {error} vs |ref| {reference.abs().max()}"


@pytest.fixture(params=["kernel", "dequantized"])
def fp32_route(request, monkeypatch) -> str:
    """Runs a test once with every fp32 batch on the int4 kernel, once with every one dequantized."""
    limit = 1 << 30 if request.param == "kernel" else 0
    monkeypatch.setattr(quantized, "FP32_KERNEL_MAX_ROWS", dict.fromkeys(TYPES, limit))
    return request.param


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dequantize_equals_gguf(qtype, shape):
    raw, reference = ggml_weight(qtype, *shape)
    linear = QuantizedLinear.from_ggml(raw, qtype, shape[1])
    assert (linear.out_features, linear.in_features) == shape
    weight = linear.dequantize()
    assert weight.dtype == torch.float32
    assert torch.equal(weight, torch.from_numpy(reference))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_kernel_weights_are_ggufs_bit_for_bit(qtype, monkeypatch):
    """One-hot rows through the fp32 kernel read the weights it holds, one input column at a time."""
    monkeypatch.setattr(quantized, "FP32_KERNEL_MAX_ROWS", dict.fromkeys(TYPES, 1 << 30))
    raw, reference = ggml_weight(qtype, 40, 96)
    linear = QuantizedLinear.from_ggml(raw, qtype, 96)
    columns = linear(torch.eye(96))  # [in, out] = W.T exactly: every other product is 0 * w
    assert torch.equal(columns.T, torch.from_numpy(reference))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_forward_fp32_matches_dequantized_matmul(qtype, shape, rows, with_bias, fp32_route):
    raw, reference = ggml_weight(qtype, *shape)
    bias = torch.randn(shape[0], generator=torch.Generator().manual_seed(1)) if with_bias else None
    linear = QuantizedLinear.from_ggml(raw, qtype, shape[1], bias=bias)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(2))
    expected = x.double() @ torch.from_numpy(reference).double().T
    if bias is not None:
        expected += bias.double()
    out = linear(x)
    assert out.dtype == torch.float32 and out.shape == (rows, shape[0])
    assert_close(out, expected, FP32_TOL)
    # Leading dimensions are kept, and each row is computed as if alone.
    assert_close(linear(x.view(1, rows, -1))[0], expected, FP32_TOL)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 8])
def test_forward_bf16_and_fp16(qtype, rows):
    raw, reference = ggml_weight(qtype, 40, 96)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(1))
    linear = QuantizedLinear.from_ggml(raw, qtype, 96, bias=bias)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(2))
    expected = x.double() @ torch.from_numpy(reference).double().T + bias.double()
    out = linear(x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert_close(out, expected, BF16_TOL)
    out = linear(x.half())  # computed in fp32: only the fp16 rounding of input and output is lost
    assert out.dtype == torch.float16
    assert_close(out, expected, 2e-3)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_fused_equals_separate(qtype, fp32_route):
    in_features = 64
    sizes = [48, 16, 40]  # q, k, v; 40 makes the fused module pad where a part did
    parts = [QuantizedLinear.from_ggml(ggml_weight(qtype, out, in_features, seed)[0], qtype, in_features,
                                       bias=torch.full((out,), float(seed)))
             for seed, out in enumerate(sizes)]
    fused = fuse_quantized(*parts)
    assert (fused.out_features, fused.in_features, fused.qtype) == (sum(sizes), in_features, qtype)
    assert torch.equal(fused.dequantize(), torch.cat([part.dequantize() for part in parts]))
    for rows in (1, 8):
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
        separate = torch.cat([part(x) for part in parts], dim=-1)
        torch.testing.assert_close(fused(x), separate, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(fused(x.bfloat16()), torch.cat([p(x.bfloat16()) for p in parts], -1))


def test_model_to_bfloat16_keeps_the_weights():
    """The loader casts the whole model with .to(dtype): the quantized weight must come through intact."""
    raw, reference = ggml_weight(Q.Q4_1, 48, 64)
    linear = QuantizedLinear.from_ggml(raw, Q.Q4_1, 64, bias=torch.ones(48))
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(5))
    before, before_bf16 = linear(x), linear(x.bfloat16())
    linear.to(torch.bfloat16)
    assert torch.equal(linear.dequantize(), torch.from_numpy(reference))
    assert torch.equal(linear(x.bfloat16()), before_bf16)
    assert_close(linear(x), before.double(), 1e-2)  # fp32 x with the bias now in bf16
    assert set(linear.state_dict()) == {"raw", "bias"}


def test_fuse_refuses_mixed_parts():
    q4 = QuantizedLinear.from_ggml(ggml_weight(Q.Q4_0, 16, 64)[0], Q.Q4_0, 64)
    q8 = QuantizedLinear.from_ggml(ggml_weight(Q.Q8_0, 16, 64)[0], Q.Q8_0, 64)
    wide = QuantizedLinear.from_ggml(ggml_weight(Q.Q4_0, 16, 96)[0], Q.Q4_0, 96)
    biased = QuantizedLinear.from_ggml(ggml_weight(Q.Q4_0, 16, 64)[0], Q.Q4_0, 64, bias=torch.zeros(16))
    with pytest.raises(ValueError, match="Q8_0.*Q4_0.*share the type"):
        fuse_quantized(q4, q8)
    with pytest.raises(ValueError, match="in_features"):
        fuse_quantized(q4, wide)
    with pytest.raises(ValueError, match="with and without bias"):
        fuse_quantized(q4, biased)
    with pytest.raises(ValueError, match="at least one"):
        fuse_quantized()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_permuted_raw_rows_permute_the_weight(qtype):
    """What the loader does to undo llama.cpp's Q/K permutation: index the raw rows (output features)."""
    raw, reference = ggml_weight(qtype, 48, 64)
    perm = np.random.default_rng(3).permutation(48)
    linear = QuantizedLinear.from_ggml(raw, qtype, 64)
    permuted = QuantizedLinear.from_ggml(raw[perm], qtype, 64)
    assert torch.equal(permuted.dequantize(), torch.from_numpy(reference[perm]))
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(4))
    assert torch.equal(permuted(x), linear(x)[:, perm])


def test_unsupported_types_are_refused_by_name_and_shape():
    with pytest.raises(ValueError, match=r"not Q5_1 \(tensor of shape \(4, 24\)\)"):
        QuantizedLinear.from_ggml(np.zeros((4, 24), np.uint8), Q.Q5_1, 32)
    with pytest.raises(ValueError, match=r"Q6_K rows as the file stores them \(shape \(4, 210\)\): re-encode"):
        QuantizedLinear.from_ggml(np.zeros((4, 210), np.uint8), Q.Q6_K, 256)
    with pytest.raises(ValueError, match=r"not F16 \(tensor of shape \(4, 64\)\)"):
        QuantizedLinear.from_ggml(np.zeros((4, 64), np.float16), Q.F16, 64)
    with pytest.raises(ValueError, match="unknown ggml type 999"):
        QuantizedLinear.from_ggml(np.zeros((4, 18), np.uint8), 999, 32)


def test_shapes_that_are_not_whole_blocks_are_refused():
    """ggml cannot hold a row of 48 in 32-blocks (nor can the kernel take K % 32 != 0): no fallback."""
    raw, _ = ggml_weight(Q.Q4_0, 16, 64)
    with pytest.raises(ValueError, match="in_features 48 is not a multiple"):
        QuantizedLinear.from_ggml(raw[:, :27], Q.Q4_0, 48)
    with pytest.raises(ValueError, match=r"36 bytes a row, the tensor has shape \(16, 54\)"):
        QuantizedLinear.from_ggml(np.zeros((16, 54), np.uint8), Q.Q4_0, 64)
    with pytest.raises(ValueError, match=r"uint8 \[out, row_bytes\]"):
        QuantizedLinear.from_ggml(raw.reshape(-1), Q.Q4_0, 64)
    with pytest.raises(ValueError, match="bias of shape"):
        QuantizedLinear.from_ggml(raw, Q.Q4_0, 64, bias=torch.zeros(15))


def test_inputs_it_cannot_take_are_refused():
    linear = QuantizedLinear.from_ggml(ggml_weight(Q.Q4_0, 16, 64)[0], Q.Q4_0, 64)
    with pytest.raises(TypeError, match="torch.int64"):
        linear(torch.ones(1, 64, dtype=torch.int64))
    with pytest.raises(ValueError, match="CPU only"):
        linear(torch.ones(1, 64, device="meta"))
