"""A whole decode step of a tiny model with decode attention on the Triton backend, which on CUDA also takes
RoPE + cache write (engine/kernels/gpu/triton_rope_cache.py) and residual add + RMSNorm
(engine/kernels/gpu/triton_add_rmsnorm.py), against the same step on the torch backend; on the CPU under
Triton's interpreter.

A Llama-shaped model (GQA) and a Gemma-shaped one (sandwich norms, q/k norms, windowed layers with a RoPE
base of their own beside a full one), random weights (norm weights away from 1), a random cache history,
decodes of very different lengths: the final hidden states within 1e-4 (the two paths sum in different
orders, through two layers), and the caches the step writes within 1e-5, the rest untouched. On a GPU
the gpu-marked test compares the same step there, compiled, within 1e-3 (SDPA's kernels beside ours).
"""

from __future__ import annotations

import pytest
import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.scheduler.kv_cache import KVShape, PagedKVCache
from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

BLOCK_SIZE = 16
CONFIGS = {
    "llama": ModelConfig(model_type="llama", vocab_size=64, hidden_size=128, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=4096),
    "gemma": ModelConfig(model_type="gemma3_text", vocab_size=64, hidden_size=128, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                         max_position_embeddings=4096, sliding_window=40,
                         layer_types=("sliding_attention", "full_attention"), rope_local_theta=10000.0,
                         rope_theta=1e6, qk_norm=True, sandwich_norms=True, hidden_act="gelu_pytorch_tanh",
                         embedding_multiplier=128 ** 0.5, query_pre_attn_scalar=32),
}


def serving_step(config, backend, sequences, seed, device="cpu", fed=None):
    """(final hidden states, key cache, value cache, slots) of one serving step, every layer on `backend`.
    `sequences`: (cached, new) tokens per sequence, its cached history already in the cache (a decode
    is new=1); `fed`: the indexes of those this step feeds (all by default). The weights, the cache's
    contents, the block tables and each sequence's tokens follow from the seed and `sequences` alone, so
    a step that feeds some of them sees the same inputs for those as the step that feeds them all."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(torch.rand_like(parameter) + 0.5)
    model.to(device).fuse_for_inference()  # as the loader does: q/k/v and gate/up each one projection
    model.set_decode_attention(backend)
    model.set_invariant_gemm(device == "cuda")  # as an engine on CUDA: cuBLAS's rows follow the row count
    blocks = [-(-(cached + new) // BLOCK_SIZE) for cached, new in sequences]
    cache = PagedKVCache(KVShape.of(config), sum(blocks) + 2, BLOCK_SIZE, torch.float32, device)
    cache.keys.normal_()
    cache.values.normal_()
    order = torch.randperm(sum(blocks)).tolist()
    tables, tokens = [], []
    for count, (_, new) in zip(blocks, sequences):
        tables.append(order[:count])
        order = order[count:]
        tokens.append(torch.randint(0, config.vocab_size, (new,)))
    fed = range(len(sequences)) if fed is None else fed
    cached = [sequences[i][0] for i in fed]
    query_lens = [sequences[i][1] for i in fed]
    metadata = AttentionMetadata.build(block_size=BLOCK_SIZE, block_tables=[tables[i] for i in fed],
                                       cached_lens=cached, query_lens=query_lens,
                                       sliding_window=config.sliding_window,
                                       some_layers_windowed=config.layer_types is not None, device=device)
    positions = torch.cat([torch.arange(c, c + n) for c, n in zip(cached, query_lens)])
    with torch.inference_mode():
        hidden = model(torch.cat([tokens[i] for i in fed]).to(device), positions.to(device), metadata, cache)
    return hidden, cache.keys, cache.values, metadata.slot_mapping


def decode_step(config, backend, lengths, seed, device="cpu"):
    """serving_step with one decode per sequence of `lengths` tokens (the last one fed now)."""
    return serving_step(config, backend, [(n - 1, 1) for n in lengths], seed, device)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_decode_step_on_the_triton_backend_matches_the_torch_backend(name):
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the interpreter's check is for the CPU")
    lengths = [300, 1, 17, 129]
    hidden, keys, values, slots = decode_step(CONFIGS[name], "triton", lengths, seed=5)
    expected_hidden, expected_keys, expected_values, _ = decode_step(CONFIGS[name], "torch", lengths, seed=5)
    torch.testing.assert_close(hidden, expected_hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(keys, expected_keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, expected_values, atol=1e-5, rtol=1e-5)
    others = torch.ones(keys.shape[1], dtype=torch.bool)
    others[slots] = False
    assert torch.equal(keys[:, others], expected_keys[:, others])


# Decodes of very different lengths, a prompt with nothing cached, a chunk after cached keys (past the
# sliding window's 40 in Gemma's windowed layer).
MIXED = [(299, 1), (0, 1), (16, 1), (128, 1), (0, 23), (50, 9)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_step_with_prefills_on_the_triton_backend_matches_the_torch_backend(name):
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the interpreter's check is for the CPU")
    hidden, keys, values, _ = serving_step(CONFIGS[name], "triton", MIXED, seed=8)
    expected_hidden, expected_keys, expected_values, _ = serving_step(CONFIGS[name], "torch", MIXED, seed=8)
    torch.testing.assert_close(hidden, expected_hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(keys, expected_keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, expected_values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_on_the_triton_backend_a_decode_is_the_same_bits_beside_prefills_or_not(name):
    """What batch invariance needs of a serving step on CUDA: a decode's hidden state and the keys it
    writes do not depend on prefills sharing its step (the same norm, RoPE and attention kernels)."""
    if not INTERPRETED:
        pytest.skip("a CUDA device is here: the gpu-marked test checks the compiled kernels")
    decodes = [i for i, (_, new) in enumerate(MIXED) if new == 1]
    alone, keys, values, slots = serving_step(CONFIGS[name], "triton", MIXED, seed=9, fed=decodes)
    beside, mixed_keys, mixed_values, _ = serving_step(CONFIGS[name], "triton", MIXED, seed=9)
    assert torch.equal(beside[: len(decodes)], alone)  # MIXED lists the decodes first
    assert torch.equal(mixed_keys[:, slots], keys[:, slots]) and torch.equal(mixed_values[:, slots], values[:, slots])


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_on_cuda_the_triton_backend_is_close_to_torch_and_a_decode_keeps_its_bits_beside_prefills(name):
    hidden, _, _, _ = serving_step(CONFIGS[name], "triton", MIXED, seed=10, device="cuda")
    expected, _, _, _ = serving_step(CONFIGS[name], "torch", MIXED, seed=10, device="cuda")
    torch.testing.assert_close(hidden, expected, atol=1e-3, rtol=1e-3)
    decodes = [i for i, (_, new) in enumerate(MIXED) if new == 1]
    alone, _, _, _ = serving_step(CONFIGS[name], "triton", MIXED, seed=10, device="cuda", fed=decodes)
    assert torch.equal(hidden[: len(decodes)], alone)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_on_cuda_a_decode_step_on_the_triton_backend_matches_the_torch_backend(name):
    lengths = [3000, 1, 17, 129]
    hidden, keys, values, _ = decode_step(CONFIGS[name], "triton", lengths, seed=6, device="cuda")
    expected_hidden, expected_keys, expected_values, _ = decode_step(CONFIGS[name], "torch", lengths, seed=6,
                                                                     device="cuda")
    torch.testing.assert_close(hidden, expected_hidden, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(keys, expected_keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, expected_values, atol=1e-5, rtol=1e-5)
