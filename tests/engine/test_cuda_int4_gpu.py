"""CudaInt4Linear and a Q4_0 GGUF served quantized, on a CUDA device: torch's int4 kernel computes with the
weights the per-call dequantization gives, bit for bit; the module's outputs on either route stay within
the tolerance the stated weight bound gives (engine/kernels/gpu/cuda_int4.py); and a model served quantized is
as close to the exact fp32 model as the bfloat16 dequantized one, through the engine's graphs as eagerly.
Marked gpu: skipped without CUDA; bench/gpu_check.sh runs them on a GPU machine (where the gguf package
comes from the wheels bench/gpu_webdeps.py fetches into .whl/; without them the module is skipped).

Why logits and not equal greedy tokens against weights="dequantized": both models are bfloat16, with
weights that differ by bf16 roundings (the quantized one rounds d, then each weight; the dequantized one
each weight once), and on the tiny test models their argmax differs at bf16 near-ties: 2 to 7 of 96
greedy steps in a CPU emulation of these weights (four prompts, two seeds, two embedding types), where
each model's logits are 3-6% of their scale away from the fp32 model's. So each is compared with the fp32
model instead: the quantized model's mean logit error may be at most 1.5x the bf16 dequantized model's
(0.9-1.2x in that emulation), and every greedy token it picks must be within 5% of the logit scale of
the fp32 model's best (at most 1.8% there).
"""

from __future__ import annotations

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package (bench/gpu_webdeps.py puts its wheel in .whl/)")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.decode.graphs import DecodeGraphs, GraphMode  # noqa: E402
from engine.loading.loader import load_model  # noqa: E402
from engine.kernels.gpu import cuda_int4  # noqa: E402
from engine.kernels.gpu.cuda_int4 import CudaInt4Linear  # noqa: E402
from engine.kernels.int4_operands import kernel_operands  # noqa: E402
from engine.model.quantized import QuantizedLinear  # noqa: E402
from tests.engine.test_quantized_linear import ggml_weight  # noqa: E402

pytestmark = pytest.mark.gpu
Q = gguf.GGMLQuantizationType
U = 2.0**-8  # bfloat16's unit roundoff
SHAPES = [(40, 96), (48, 64), (36, 256), (512, 1024)]  # [out, in]: inner k-tiles 2, 4, 8, 8; padded columns
PROMPTS = ["class Node:", "import os", "def f(x):\n    return", "The list type", "A dictionary is",
           "Return the number of", "def main():", "The quick brown fox"]  # a whole graph bucket: no padding rows
MEAN_ERROR_RATIO = 1.5
TOKEN_DEFICIT = 0.05


def built(qtype, out: int, inp: int, bias: bool = False) -> tuple[QuantizedLinear, CudaInt4Linear]:
    values = torch.randn(out, generator=torch.Generator().manual_seed(1)).bfloat16().float() if bias else None
    linear = QuantizedLinear.from_ggml(ggml_weight(qtype, out, inp)[0], qtype, inp, bias=values)
    module = CudaInt4Linear.from_quantized(linear, "cuda")
    module.prepare_for_serving()
    return linear, module


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_kernel_computes_with_the_dequantized_weights_bit_for_bit(qtype, shape):
    """One-hot rows read the kernel's weights back one input column at a time (every other product is
    0 * w, the sum exact, the bf16 output the bf16 weight): they must be dequantize()'s."""
    _, module = built(qtype, *shape)
    eye = torch.eye(shape[1], dtype=torch.bfloat16, device="cuda")
    columns = torch.cat([module(eye[i: i + cuda_int4.MAX_ROWS]) for i in range(0, shape[1], cuda_int4.MAX_ROWS)])
    weights = module.dequantize()
    assert torch.equal(columns.T, weights), f"{int((columns.T != weights).sum())} weights differ"


@pytest.fixture
def fp32_reductions():
    """cuBLAS may round a bf16 GEMM's split-K partial sums to bf16 unless told not to (torch allows it by
    default); told not to, the F.linear route sums in fp32 as the int4 kernel does."""
    matmul = torch.backends.cuda.matmul
    allowed = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    yield
    matmul.allow_bf16_reduced_precision_reduction = allowed


@pytest.mark.usefixtures("fp32_reductions")
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("rows", [1, cuda_int4.MAX_ROWS + 1], ids=["kernel", "dequantized"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_outputs_are_within_the_tolerance_the_weight_bound_gives(qtype, shape, rows, bias):
    """Against x @ W.T in float64, W gguf's exact weights. Per output: the weight bound B summed over the
    row, |x| @ B.T; fp32 accumulation, K 2^-23 |x| @ (|W| + B).T; the output's bf16 rounding, u |y|; and
    with a bias the second rounding of the sum."""
    linear, module = built(qtype, *shape, bias=bias)
    nibbles, scales_zeros = kernel_operands(linear.raw.numpy(), qtype)
    out, inp = shape
    q = nibbles[:out].double().cuda()
    scale, zero = (scales_zeros[:, :out, i].T.double().cuda().repeat_interleave(32, dim=1) for i in (0, 1))
    w = linear.dequantize().double().cuda()
    bound = U * w.abs() + U * (1 + U) * ((q - 8).abs() * scale.abs() + zero.abs())
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(2)).bfloat16().cuda()
    got = module(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out)
    xd = x.double()
    y = xd @ w.T
    weight_error = xd.abs() @ bound.T + inp * 2.0**-23 * (xd.abs() @ (w.abs() + bound).T)
    tolerance = (1 + U) * weight_error + U * (y.abs() + weight_error)
    if bias:  # |bf16(sum)| <= |y| + tolerance, and the sum with b rounds once more
        b = linear.bias.double().cuda()
        tolerance = tolerance + U * (1 + U) * (y.abs() + tolerance + b.abs())
        y = y + b
    error = (got.double() - y).abs()
    assert bool((error <= tolerance).all()), f"max error / tolerance {float((error / tolerance).max()):.3f}"
    assert float(error.max()) > 0, "liveness: bfloat16 rounding shows somewhere"


def exact_logits(model, ids: list[int]) -> torch.Tensor:
    """[T, vocab] float32 logits of every position of ids, through the model's plain forward."""
    with torch.no_grad():
        tokens = torch.tensor([ids], device="cuda")
        return model.logits(model(tokens, torch.arange(len(ids), device="cuda")[None]))[0].float()


@pytest.fixture
def q4_0_gguf(tiny_gguf):
    path, _ = tiny_gguf("llama", "Q4_0", seed=7, embedding_qtype="Q8_0")
    return path


def test_a_model_served_quantized_is_as_close_to_the_exact_model_as_bfloat16_is(q4_0_gguf):
    """Teacher-forced logits of every position, with fewer rows than MAX_ROWS (the int4 kernel) and more
    (the per-call dequantization), against the fp32 model of the same file."""
    quantized = load_model(q4_0_gguf, device="cuda", dtype="bfloat16", weights="quantized")
    dequantized = load_model(q4_0_gguf, device="cuda", dtype="bfloat16", weights="dequantized").model
    exact = load_model(q4_0_gguf, device="cuda", dtype="float32", weights="dequantized").model
    attention = quantized.model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, CudaInt4Linear) and isinstance(attention._qkv, CudaInt4Linear), \
        "liveness: the projections really are served 4-bit"
    assert attention._qkv.packed is not None and attention.q_proj.packed is None
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 3
    ids = quantized.tokenizer.encode(text)
    assert len(ids) > cuda_int4.MAX_ROWS + 10
    for length in (cuda_int4.MAX_ROWS // 2, len(ids)):
        reference = exact_logits(exact, ids[:length])
        ours = (exact_logits(quantized.model, ids[:length]) - reference).abs().mean()
        bf16 = (exact_logits(dequantized, ids[:length]) - reference).abs().mean()
        print(f"\n{length} rows: mean |logit error| quantized {float(ours):.4f}, bf16 {float(bf16):.4f}")
        assert ours <= MEAN_ERROR_RATIO * bf16


def test_served_quantized_greedy_tokens_replay_like_eager_and_near_the_exact_models(q4_0_gguf):
    assert DecodeGraphs.bucket_for(len(PROMPTS)) == len(PROMPTS)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    config = dict(model=str(q4_0_gguf), device="cuda", dtype="bfloat16", weights="quantized", max_num_seqs=8,
                  kv_cache_mb=64)
    eager = Engine(EngineConfig(**config, graphs=False, device_loop=False)).generate(PROMPTS, params)
    engine = Engine(EngineConfig(**config, graphs=True, capture_stream=True, device_loop=True, verify_always=True))
    served = engine.generate(PROMPTS, params)
    graphs = engine.runner.graphs
    assert graphs.mode is GraphMode.CUDA_GRAPHS, graphs.refusal
    records = list(graphs.verify.records)
    assert records and all(r.argmax_agrees for r in records)
    assert [r.token_ids for r in served] == [r.token_ids for r in eager]
    exact = load_model(q4_0_gguf, device="cuda", dtype="float32", weights="dequantized")
    for prompt, result in zip(PROMPTS, served):
        ids = exact.tokenizer.encode(prompt) + result.token_ids
        logits = exact_logits(exact.model, ids)[-len(result.token_ids) - 1: -1]  # the position before each token
        chosen = logits.gather(1, torch.tensor(result.token_ids, device="cuda")[:, None])[:, 0]
        deficit = (logits.max(dim=1).values - chosen) / logits.abs().max(dim=1).values
        assert float(deficit.max()) <= TOKEN_DEFICIT, (prompt, deficit.tolist())
