"""The RoPE + KV-cache-write kernel (engine/kernels/gpu/triton_rope_cache.py) against the module path it stands
for (engine/model/attention.py: `apply_rope` over the q and k heads with the tables of `rope_cos_sin`, then
`index_copy_` of k and v into the paged caches by slot), on the CPU under Triton's interpreter.

GQA (fewer KV heads than query heads), head dims 64 and 128, llama3-scaled frequencies, positions far
apart, slots scattered over a cache larger than the step; the q/k/v heads as views into one fused
projection output, as the model passes them. float32: the rotated queries within 1e-6 absolute and
relative, the whole caches likewise (every slot the step does not own untouched, bit for bit). bfloat16
on a GPU only (the gpu-marked test): Triton 3.9's interpreter truncates float32 to bfloat16 where
compiled code and torch round to nearest even, so the rounded products differ there.
"""

from __future__ import annotations


import pytest
import torch

from engine.model.config import ModelConfig
from engine.model.rope import apply_rope, rope_cos_sin, rope_inverse_frequencies
from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

from engine.kernels.gpu import triton_rope_cache  # noqa: E402

TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@pytest.fixture
def kernel():
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the compiled kernel is tested on it (test_on_cuda_against_the_module_path)")
    return triton_rope_cache


def random_step(tokens, heads, kv_heads, dim, dtype, device, seed):
    """A fused projection output [N, H + 2 Hkv, D], the step's RoPE tables, caches with random contents and
    a distinct slot per token drawn from them."""
    g = torch.Generator().manual_seed(seed)
    config = ModelConfig(model_type="llama", vocab_size=16, hidden_size=heads * dim, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=dim,
                         max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=LLAMA3)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim, generator=g).to(dtype).to(device)
    positions = torch.randint(0, 100000, (tokens,), generator=g).to(device)
    cos, sin = rope_cos_sin(rope_inverse_frequencies(config).to(device), positions, dtype)  # [N, 1, D]
    cache_slots = tokens * 3 + 5
    caches = tuple(torch.randn(cache_slots, kv_heads, dim, generator=g).to(dtype).to(device) for _ in range(2))
    slots = torch.randperm(cache_slots, generator=g)[:tokens].to(device)
    return qkv, cos, sin, slots, caches


def module_path(qkv, heads, kv_heads, cos, sin, slots, caches):
    key_cache, value_cache = (c.clone() for c in caches)
    qk = apply_rope(qkv[:, : heads + kv_heads], cos, sin)
    key_cache.index_copy_(0, slots, qk[:, heads:])
    value_cache.index_copy_(0, slots, qkv[:, heads + kv_heads:])
    return qk[:, :heads], key_cache, value_cache


def check(kernel, tokens, heads, kv_heads, dim, dtype=torch.float32, device="cpu", seed=0):
    qkv, cos, sin, slots, caches = random_step(tokens, heads, kv_heads, dim, dtype, device, seed)
    expected_q, expected_keys, expected_values = module_path(qkv, heads, kv_heads, cos, sin, slots, caches)
    key_cache, value_cache = (c.clone() for c in caches)
    q = kernel.rope_and_cache_write(qkv[:, :heads], qkv[:, heads: heads + kv_heads], qkv[:, heads + kv_heads:],
                                    cos, sin, slots, key_cache, value_cache)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(q, expected_q, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(key_cache, expected_keys, atol=tolerance, rtol=tolerance)
    assert torch.equal(value_cache, expected_values)
    others = torch.ones(caches[0].shape[0], dtype=torch.bool, device=device)
    others[slots] = False
    assert torch.equal(key_cache[others], caches[0][others]) and torch.equal(value_cache[others], caches[1][others])


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 1)])
def test_against_the_module_path(kernel, heads, kv_heads, dim):
    check(kernel, 5, heads, kv_heads, dim, seed=dim + heads)


def test_one_token_and_equal_heads(kernel):
    check(kernel, 1, 4, 4, 64, seed=7)


def test_head_dims_that_do_not_halve_are_refused():
    q, kv = torch.zeros(2, 4, 63), torch.zeros(2, 2, 63)
    cache = torch.zeros(8, 2, 63)
    with pytest.raises(ValueError, match="halve"):
        triton_rope_cache.rope_and_cache_write(q, kv, kv, torch.zeros(2, 1, 63), torch.zeros(2, 1, 63),
                                               torch.arange(2), cache, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_against_the_module_path(dtype):
    check(triton_rope_cache, 33, 32, 8, 128, dtype=dtype, device="cuda", seed=3)
    check(triton_rope_cache, 7, 8, 2, 64, dtype=dtype, device="cuda", seed=4)
