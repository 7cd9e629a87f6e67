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


def decode_step(config, backend, lengths, seed, device="cpu"):
    """(final hidden states, key cache, value cache, slots) of one decode step per sequence of `lengths`
    tokens (its history already in the cache), every layer's decodes on `backend`."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(torch.rand_like(parameter) + 0.5)
    model.to(device).set_decode_attention(backend)
    blocks = [-(-n // BLOCK_SIZE) for n in lengths]
    cache = PagedKVCache(KVShape.of(config), sum(blocks) + 2, BLOCK_SIZE, torch.float32, device)
    cache.keys.normal_()
    cache.values.normal_()
    order = torch.randperm(sum(blocks)).tolist()
    tables = []
    for count in blocks:
        tables.append(order[:count])
        order = order[count:]
    positions = [n - 1 for n in lengths]
    metadata = AttentionMetadata.build(block_size=BLOCK_SIZE, block_tables=tables, cached_lens=positions,
                                       query_lens=[1] * len(lengths), sliding_window=config.sliding_window,
                                       some_layers_windowed=config.layer_types is not None, device=device)
    tokens = torch.randint(0, config.vocab_size, (len(lengths),))
    with torch.inference_mode():
        hidden = model(tokens.to(device), torch.tensor(positions, device=device), metadata, cache)
    return hidden, cache.keys, cache.values, metadata.slot_mapping


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
