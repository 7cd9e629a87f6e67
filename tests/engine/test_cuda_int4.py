"""CudaInt4Linear without a GPU: the nibble bytes torch's CUDA packing reads, the bfloat16 weights its
per-call dequantization gives (the kernel's, by construction) within the bound engine/kernels/gpu/cuda_int4.py
states, fusion, the forward's plumbing on a faked CUDA device, and which GGUF tensors the loader keeps
4-bit on CUDA. tests/engine/test_cuda_int4_gpu.py runs the kernel itself on a GPU.

Weights are random, quantized by `gguf.quants.quantize` (test_quantized_linear.py's `ggml_weight`); the
reference is QuantizedLinear.dequantize(), which equals gguf's dequantization bit for bit.
"""

from __future__ import annotations

import logging

import gguf
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from engine.loading import gguf_weights
from engine.loading.gguf_model import GGUFCheckpoint
from engine.loading.loader import load_model
from engine.loading.model_errors import ModelLoadError
from engine.model.llama import LlamaForCausalLM
from engine.kernels.gpu.cuda_int4 import (MAX_ROWS, CudaInt4Linear, dequantize_int4, fuse_cuda_int4, inner_k_tiles,
                                    pack_nibbles, unpack_nibbles)
from engine.model.layers import fuse_projections
from engine.kernels.int4_operands import kernel_operands
from engine.model.quantized import QuantizedLinear
from engine.model.quantized_embedding import QuantizedEmbedding
from tests.engine.test_quantized_linear import ggml_weight

Q = gguf.GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1]
SHAPES = [(48, 64), (40, 96), (36, 256)]  # [out, in]: 36 is no multiple of the kernel's 8-column tile
U = 2.0**-8  # bfloat16's unit roundoff


def weight_bound(linear: QuantizedLinear) -> torch.Tensor:
    """The module docstring's bound on |w' - w| for each weight, float64 [out, in]:
    u |w| + u (1 + u) (|q - 8| |d| + |m + 8d|)."""
    nibbles, scales_zeros = kernel_operands(linear.raw.numpy(), linear.qtype)
    out = linear.out_features
    q = nibbles[:out].double()
    scale, zero = (scales_zeros[:, :out, i].T.double().repeat_interleave(32, dim=1) for i in (0, 1))
    w = linear.dequantize().double()
    return U * w.abs() + U * (1 + U) * ((q - 8).abs() * scale.abs() + zero.abs())


def cpu_built(qtype: Q, out: int, inp: int, seed: int = 0, bias: torch.Tensor | None = None
              ) -> tuple[QuantizedLinear, CudaInt4Linear]:
    linear = QuantizedLinear.from_ggml(ggml_weight(qtype, out, inp, seed)[0], qtype, inp, bias=bias)
    return linear, CudaInt4Linear.from_quantized(linear, "cpu")  # built, not run, on the CPU


def test_nibbles_pack_two_to_a_byte_the_even_element_high():
    """torch's test_linalg.py packs for CUDA as (q[:, ::2] << 4 | q[:, 1::2]): element 2j high in byte j."""
    assert pack_nibbles(torch.tensor([[1, 2, 3, 4], [15, 0, 0, 15]])).tolist() == [[0x12, 0x34], [0xF0, 0x0F]]
    nibbles = torch.randint(0, 16, (40, 96), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = pack_nibbles(nibbles)
    assert packed.dtype == torch.uint8 and packed.shape == (40, 48)
    assert torch.equal(unpack_nibbles(packed), nibbles.to(torch.uint8))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_the_module_holds_the_kernel_operands_nibbles_and_bfloat16_scales(qtype):
    linear, module = cpu_built(qtype, 40, 96)
    nibbles, scales_zeros = kernel_operands(linear.raw.numpy(), qtype)
    assert torch.equal(unpack_nibbles(module.nibbles), nibbles[:40].to(torch.uint8))
    assert module.scales_zeros.dtype == torch.bfloat16 and module.scales_zeros.shape == (3, 40, 2)
    assert torch.equal(module.scales_zeros, scales_zeros[:, :40].to(torch.bfloat16))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_dequantized_weights_are_ggufs_within_the_stated_bound(qtype, shape):
    linear, module = cpu_built(qtype, *shape)
    reference, weights = linear.dequantize().double(), module.dequantize()
    assert weights.dtype == torch.bfloat16 and weights.shape == shape
    error, bound = (weights.double() - reference).abs(), weight_bound(linear)
    assert bool((error <= bound).all()), f"max error / bound {float((error / bound.clamp_min(1e-30)).max()):.3f}"
    # Liveness: the bound is nearly reached (scale and sum each round by up to u), so it is not loose.
    assert float((error / bound.clamp_min(1e-30)).max()) > 0.5
    if qtype == Q.Q4_0:  # zero 0: the bound is (2u + u^2) |w|, relative
        assert bool((error <= (2 * U + U * U) * reference.abs()).all())


def test_the_dequantization_runs_on_a_fused_parts_views():
    """A fused part's scales are a strided view of the fused module's: the same weights come out."""
    parts = [cpu_built(Q.Q4_1, out, 64, seed)[1] for seed, out in enumerate([48, 16, 40])]
    before = [part.dequantize() for part in parts]
    fused = fuse_cuda_int4(*parts)
    assert (fused.out_features, fused.in_features) == (104, 64)
    assert torch.equal(fused.dequantize(), torch.cat(before))
    for part, weights in zip(parts, before):
        assert part.fused_into_another and not part.scales_zeros.is_contiguous()
        assert part.nibbles.untyped_storage().data_ptr() == fused.nibbles.untyped_storage().data_ptr()
        assert torch.equal(part.dequantize(), weights)
    assert torch.equal(dequantize_int4(fused.nibbles[48:64], fused.scales_zeros[:, 48:64]), before[1])


def test_fusion_refuses_mixed_parts():
    q4_0, q4_1 = cpu_built(Q.Q4_0, 16, 64)[1], cpu_built(Q.Q4_1, 16, 64)[1]
    wide = cpu_built(Q.Q4_0, 16, 96)[1]
    biased = cpu_built(Q.Q4_0, 16, 64, bias=torch.zeros(16))[1]
    with pytest.raises(ValueError, match="Q4_1.*Q4_0.*share the type"):
        fuse_cuda_int4(q4_0, q4_1)
    with pytest.raises(ValueError, match="in_features"):
        fuse_cuda_int4(q4_0, wide)
    with pytest.raises(ValueError, match="with and without bias"):
        fuse_cuda_int4(q4_0, biased)


def test_inner_k_tiles_is_the_widest_the_kernel_takes():
    assert [inner_k_tiles(k) for k in (32, 64, 96, 128, 576, 4096)] == [2, 4, 2, 8, 4, 8]
    with pytest.raises(ValueError, match="in_features 48"):
        inner_k_tiles(48)


def test_other_types_and_inputs_are_refused():
    q8 = QuantizedLinear.from_ggml(ggml_weight(Q.Q8_0, 16, 64)[0], Q.Q8_0, 64)
    with pytest.raises(ValueError, match="Q4_0 and Q4_1, not Q8_0"):
        CudaInt4Linear.from_quantized(q8, "cpu")
    _, module = cpu_built(Q.Q4_0, 16, 64)
    with pytest.raises(ValueError, match="CUDA only, got an input on cpu"):
        module(torch.ones(1, 64, dtype=torch.bfloat16))


def on_fake_cuda(*modules: torch.nn.Module) -> FakeTensorMode:
    """Moves the modules' tensors to a faked CUDA device (shapes and dtypes, no values) and returns the mode
    to run them in: torch's meta kernels of the int4 ops check their operands as on a GPU."""
    mode = FakeTensorMode()
    for module in modules:
        module._apply(lambda t: FakeTensor(mode, t.to("meta"), torch.device("cuda")))
    return mode


@pytest.mark.parametrize("out", [40, 36])
@pytest.mark.parametrize("rows", [1, MAX_ROWS, MAX_ROWS + 1])
def test_the_forward_fits_the_cuda_ops_on_either_route(out, rows):
    _, module = cpu_built(Q.Q4_1, out, 96, bias=torch.ones(out))
    mode = on_fake_cuda(module)
    with mode:
        y = module(torch.ones(2, rows, 96, dtype=torch.bfloat16, device="cuda"))
        assert y.shape == (2, rows, out) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
        packed, scales = module.kernel_operands()
        assert packed.shape == (5, 96 // (2 * 16), 32, 1) and scales.shape == (3, 40, 2)  # rows padded to 8
        with pytest.raises(TypeError, match="bfloat16 inputs.*got torch.float32"):
            module(torch.ones(1, 96, device="cuda"))


def test_prepare_for_serving_packs_the_fused_module_and_not_its_parts():
    parts = [cpu_built(Q.Q4_0, out, 64, seed)[1] for seed, out in enumerate([32, 16])]
    fused = fuse_cuda_int4(*parts)
    mode = on_fake_cuda(fused)
    with mode:
        for module in (fused, *parts):
            module.prepare_for_serving()
    assert fused.packed is not None and fused.packed.shape == (6, 1, 32, 2)
    assert all(part.packed is None for part in parts)


def test_parts_of_different_kinds_on_cuda_run_one_matmul_each():
    """A Q4_1 v beside Q4_0 q and k, or a v of another type (dequantized on CUDA, a float Linear): the
    parts cannot share one module, so each runs alone and the outputs are concatenated."""
    q, k, v = cpu_built(Q.Q4_0, 32, 64)[1], cpu_built(Q.Q4_0, 16, 64, seed=1)[1], cpu_built(Q.Q4_1, 16, 64)[1]
    mode = on_fake_cuda(q, k, v)
    qkv = fuse_projections(q, k, v)
    with mode:
        assert qkv(torch.ones(3, 64, dtype=torch.bfloat16, device="cuda")).shape == (3, 64)
    float_v = torch.nn.Linear(64, 16, bias=False)
    fuse_projections(q, k, float_v)
    assert not any(part.fused_into_another for part in (q, k, v))
    with pytest.raises(ValueError, match="cannot fuse quantized and float"):  # the CPU's refusal stands
        fuse_projections(cpu_built(Q.Q4_0, 16, 64)[0], float_v)


def quantized_on_cuda(path, monkeypatch) -> LlamaForCausalLM:
    """The model's parameters as the loader fills them for weights='quantized' on CUDA, built on the CPU:
    only the CUDA module's move to the device is left out."""
    monkeypatch.setattr(gguf_weights, "_on_cuda",
                        lambda linear, device: CudaInt4Linear.from_quantized(linear, "cpu"))
    checkpoint = GGUFCheckpoint(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(checkpoint.config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.tie_weights()
    gguf_weights.load_gguf_weights(model, checkpoint, torch.bfloat16, quantized=True, device=torch.device("cuda"))
    return model


PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj"]


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_on_cuda_the_loader_keeps_q4_projections_4_bit_and_the_rest_bfloat16(tiny_gguf, monkeypatch, caplog, qtype):
    path, _ = tiny_gguf("llama", qtype, seed=5, embedding_qtype="Q4_0")
    with caplog.at_level(logging.INFO, logger=gguf_weights.__name__):
        model = quantized_on_cuda(path, monkeypatch)
    said = [record.getMessage() for record in caplog.records if record.name == gguf_weights.__name__]
    assert not said, "every projection is Q4: nothing to say"
    exact = load_model(path, weights="dequantized").model  # fp32, llama.cpp's Q/K row permutation undone
    for index, layer in enumerate(model.model.layers):
        for name in PROJECTIONS:
            module = layer.get_submodule(name)
            assert isinstance(module, CudaInt4Linear) and module.qtype.name == qtype, name
            # The right rows (llama.cpp's permutation undone before the module is built): a wrong row
            # would be off by the weights' own size, bf16 rounding by about 2^-7 of it.
            reference = exact.model.layers[index].get_submodule(name)
            error = (module.dequantize().double() - reference.weight.detach().double()).abs()
            assert float(error.max()) <= 2**-5 * float(reference.weight.detach().abs().max()), name
    # The embedding table and the head stay float on CUDA (both are Q4 in this file).
    assert not isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert isinstance(model.lm_head, torch.nn.Linear)
    assert model.lm_head.weight.dtype == torch.bfloat16


def test_on_cuda_other_quantized_projections_are_dequantized_after_one_line(tiny_gguf, monkeypatch, caplog):
    path, _ = tiny_gguf("llama", "Q8_0", seed=5)
    with caplog.at_level(logging.INFO, logger=gguf_weights.__name__):
        model = quantized_on_cuda(path, monkeypatch)
    said = [record.getMessage() for record in caplog.records if record.name == gguf_weights.__name__]
    assert said == ["weights='quantized' on cuda: 21 Q8_0 dequantized to bfloat16 (torch's CUDA int4 kernel "
                    "serves Q4_0 and Q4_1 only)"], said
    exact = load_model(path, weights="dequantized").model
    layer, reference = model.model.layers[0], exact.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, torch.nn.Linear)
    assert torch.equal(layer.self_attn.q_proj.weight, reference.self_attn.q_proj.weight.to(torch.bfloat16))


def test_on_cuda_the_loader_wants_bfloat16(tiny_gguf):
    path, _ = tiny_gguf("llama", "Q4_0", seed=5)
    with pytest.raises(ModelLoadError, match="weights='quantized' on CUDA needs dtype='bfloat16'"):
        load_model(path, device="cuda", dtype="float32", weights="quantized")
    with pytest.raises(ModelLoadError, match="runs on the CPU or on CUDA only, not on meta"):
        load_model(path, device="meta", dtype="bfloat16", weights="quantized")


def test_the_cpu_loader_is_unchanged_by_the_cuda_route(tiny_gguf):
    """Liveness for the tests above: on the CPU the same file still loads as QuantizedLinear."""
    path, _ = tiny_gguf("llama", "Q4_0", seed=5)
    attention = load_model(path, weights="quantized").model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, QuantizedLinear) and isinstance(attention._qkv, QuantizedLinear)
