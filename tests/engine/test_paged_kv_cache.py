"""The paged KV cache and attention metadata: block allocation, and mixed batches that stay apart.

The mixed-batch test is the seed of every later leak test: sequences that share one forward (a
prefill, a decode and a chunk, with interleaved blocks) must each get exactly the logits they would
get alone.
"""

from __future__ import annotations

import os

import pytest
import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.scheduler.kv_cache import SwapBlockAllocator, OutOfBlocks, KVShape, PagedKVCache, blocks_needed

CONFIG = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def test_allocation_is_all_or_nothing_and_frees_return_blocks():
    allocator = SwapBlockAllocator(4)
    first = allocator.allocate(3)
    assert sorted(first) == [0, 1, 2] and allocator.num_free == 1
    with pytest.raises(OutOfBlocks, match="asked for 2 KV blocks, 1 free"):
        allocator.allocate(2)
    assert allocator.num_free == 1  # the failed request took nothing
    allocator.free(first)
    assert allocator.num_free == 4
    with pytest.raises(ValueError, match="freed but not allocated"):
        allocator.free([first[0]])


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_cpu_pool_reads_zeros_and_takes_memory_only_as_blocks_are_written():
    shape = KVShape(layers=30, kv_heads=3, head_dim=64)  # SmolLM2's: 1 GiB is 45,000 tokens in bfloat16
    before = _resident_bytes()
    cache = PagedKVCache(shape, num_blocks=2912, block_size=16, dtype=torch.bfloat16, device="cpu")
    assert cache.keys.nbytes + cache.values.nbytes > 2**30
    assert cache.keys.data_ptr() % 64 == cache.values.data_ptr() % 64 == 0, "rows straddling cache lines"
    assert _resident_bytes() - before < 64 * 2**20, "the pool's pages were written at start"
    keys, values = cache.layer(29)
    assert keys.shape == (2913 * 16, 3, 64) and keys.dtype == torch.bfloat16
    assert not keys[-16:].any() and not values[:16].any(), "an unwritten block must read as zeros"
    keys[:16] = 1.5  # a block written: its pages, not the pool's
    assert keys[:16].eq(1.5).all() and not cache.keys[28, :16].any()
    assert _resident_bytes() - before < 64 * 2**20


def test_blocks_needed_rounds_up():
    assert [blocks_needed(n, 4) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]


def test_metadata_refuses_a_block_table_too_small_for_the_tokens():
    with pytest.raises(ValueError, match="do not fit"):
        AttentionMetadata.build(block_size=4, block_tables=[[0]], cached_lens=[3], query_lens=[2])


@torch.no_grad()
def test_sequences_in_one_mixed_batch_get_their_solo_logits():
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).eval()
    cache = PagedKVCache(KVShape.of(CONFIG), num_blocks=24, block_size=4, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(1)
    tokens = {name: torch.randint(0, 300, (n,), generator=gen) for name, n in (("a", 7), ("b", 21), ("c", 8))}
    tables = {"a": [5, 17], "b": [0, 9, 3, 20, 11, 2], "c": [14, 6]}  # interleaved block ids

    def prefill(name: str, count: int) -> None:
        md = AttentionMetadata.build(block_size=4, block_tables=[tables[name]], cached_lens=[0], query_lens=[count])
        model(tokens[name][:count], md.positions, md, cache)

    # b has 20 tokens cached and decodes its 21st; c has 5 cached and feeds 3 more; a is a fresh prefill.
    prefill("b", 20)
    prefill("c", 5)
    md = AttentionMetadata.build(block_size=4, block_tables=[tables["a"], tables["b"], tables["c"]],
                                 cached_lens=[0, 20, 5], query_lens=[7, 1, 3])
    flat = torch.cat([tokens["a"], tokens["b"][20:], tokens["c"][5:]])
    logits = model.logits(model(flat, md.positions, md, cache))
    batched = {"a": logits[0:7], "b": logits[7:8], "c": logits[8:11]}

    for name, rows in (("a", slice(0, 7)), ("b", slice(20, 21)), ("c", slice(5, 8))):
        seq = tokens[name]
        solo = model.logits(model(seq[None], torch.arange(len(seq))[None]))[0, rows]
        torch.testing.assert_close(batched[name], solo, rtol=1e-5, atol=1e-5)
    # Liveness: the sequences' logits really differ, so mixing them up would have been visible.
    assert not torch.allclose(batched["b"], batched["c"][-1:], atol=1e-3)
    assert md.last_token_index.tolist() == [6, 7, 10]
