"""A step that mixes decodes with a prefill chunk: the decodes attend as in a step of decodes only, the
chunk over its own keys only.

What must hold: a decode's attention output is bitwise the same whether its step also carries a long
prefill chunk or not, and so are its logits whatever chunk shares its step (at one token count, since
CPU matrix products differ with their row count); a chunk's rows equal the unchunked prefill's within
fp32 tolerance, with and without a sliding window, at chunk boundaries inside a block; and nobody
attends to keys it does not own: the decode's one query reads its own blocks, the chunk its own
history plus itself, where the padded path made every row attend as the step's longest query run
over its longest history. The attention tests run on both CPU paths: the torch split and the native
op (engine/kernels/cpu/paged_attention.py) that the CPU uses where it is built.
"""

from __future__ import annotations

import pytest
import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.model import attention, attention_metadata
from engine.model.attention_metadata import decode_metadata
from engine.scheduler.kv_cache import KVShape, PagedKVCache

CONFIG = ModelConfig(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
BLOCK = 4
# Two decodes (37 and 6 tokens cached) and a long prompt whose 32-token chunk starts 200 tokens in. At
# these lengths the padded path's result for the decode changed with the chunk beside it.
A, C = list(range(3, 13)), [1, 2]                         # block ids: A's 10 blocks hold 40 slots
LONG, SHORT = list(range(13, 73)), list(range(73, 81))    # 240 slots; a fresh prompt's 32
A_CACHED, C_CACHED, CHUNK_AT, CHUNK = 37, 6, 200, 32
NUM_BLOCKS = 81


def random_cache(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    shape = (NUM_BLOCKS * BLOCK, CONFIG.num_key_value_heads, CONFIG.head_dim)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def qkv(tokens: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim = CONFIG.num_attention_heads, CONFIG.num_key_value_heads, CONFIG.head_dim
    return tuple(torch.randn(tokens, h, dim, generator=gen).to(dtype) for h in (heads, kv_heads, kv_heads))


PATHS = ["torch", "native"]


@pytest.fixture
def attention_path(request, monkeypatch) -> str:
    """"torch": the decode/prefill split (SDPA, the float32-math decode); "native": the one CPU op."""
    if request.param == "torch":
        monkeypatch.setattr(attention, "native_attention", lambda device: False)
    else:
        request.getfixturevalue("native_cpu_kernels")
    return request.param


@pytest.mark.parametrize("attention_path", PATHS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_a_decodes_attention_is_bitwise_the_same_beside_a_long_chunk_or_alone(dtype, attention_path):
    layer = attention.Attention(CONFIG)
    decode_q, decode_k, decode_v = qkv(2, dtype, seed=1)  # A's and C's new token
    chunk_q, chunk_k, chunk_v = qkv(CHUNK, dtype, seed=2)

    alone_md = AttentionMetadata.build(block_size=BLOCK, block_tables=[A, C], cached_lens=[A_CACHED, C_CACHED],
                                       query_lens=[1, 1], dtype=dtype)
    alone = layer._paged(decode_q, decode_k, decode_v, alone_md, random_cache(dtype))

    # The chunk sits between the decodes, so their flat token order is not their order among decodes.
    mixed_md = AttentionMetadata.build(block_size=BLOCK, block_tables=[C, LONG, A],
                                       cached_lens=[C_CACHED, CHUNK_AT, A_CACHED], query_lens=[1, CHUNK, 1],
                                       dtype=dtype)
    flat = [torch.cat([t[1:2], chunk, t[0:1]]) for t, chunk in
            ((decode_q, chunk_q), (decode_k, chunk_k), (decode_v, chunk_v))]
    mixed = layer._paged(*flat, mixed_md, random_cache(dtype))
    assert torch.equal(mixed[-1], alone[0]) and torch.equal(mixed[0], alone[1])

    # The captured graphs' metadata (device tensors only) gives the very same rows for the same tables.
    tables = torch.tensor([A, C + C[-1:] * (len(A) - len(C))])
    graph_md = decode_metadata(tables, torch.tensor([A_CACHED, C_CACHED]), BLOCK, None, dtype)
    assert torch.equal(layer._paged(decode_q, decode_k, decode_v, graph_md, random_cache(dtype)), alone)
    # Liveness: the chunk's rows are really computed, and the decodes' differ from each other.
    assert not torch.equal(alone[0], alone[1]) and mixed[1:-1].abs().sum() > 0


@pytest.mark.parametrize("attention_path", PATHS, indirect=True)
@torch.no_grad()
def test_the_decode_mask_is_built_once_a_step_and_only_where_it_is_read(attention_path, monkeypatch):
    """The native op bounds each decode by its position and never reads the additive mask, so its steps
    build none; the torch path builds it once for every layer (as the Triton kernel's steps build none:
    tests/kernels/test_triton_paged_decode.py)."""
    real_mask, built = attention_metadata._decode_mask, []

    def counted_mask(*args):
        built.append(args)
        return real_mask(*args)

    monkeypatch.setattr(attention_metadata, "_decode_mask", counted_mask)
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).eval()
    cache = PagedKVCache(KVShape.of(CONFIG), num_blocks=NUM_BLOCKS, block_size=BLOCK, dtype=torch.float32, device="cpu")
    for metadata in (AttentionMetadata.build(block_size=BLOCK, block_tables=[A, C], cached_lens=[A_CACHED, C_CACHED],
                                             query_lens=[1, 1]),
                     decode_metadata(torch.tensor([A, C + C[-1:] * (len(A) - len(C))]),
                                     torch.tensor([A_CACHED, C_CACHED]), BLOCK, None, torch.float32)):
        built.clear()
        logits = model.logits(model(torch.tensor([5, 6]), metadata.positions, metadata, cache))
        assert len(built) == (1 if attention_path == "torch" else 0), f"{len(built)} masks for one step"
        assert torch.isfinite(logits).all()


@torch.no_grad()
def test_a_decodes_logits_do_not_depend_on_which_chunk_shares_its_step():
    """Two steps of one token count (so every matrix product has the same shape): the decode beside a
    chunk at the start of a prompt, and beside a chunk 200 tokens deep into another one."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).eval()
    gen = torch.Generator().manual_seed(4)
    decode_tokens = torch.randint(0, 300, (A_CACHED + 1,), generator=gen)
    long_tokens = torch.randint(0, 300, (CHUNK_AT + CHUNK,), generator=gen)
    cache = PagedKVCache(KVShape.of(CONFIG), num_blocks=NUM_BLOCKS, block_size=BLOCK, dtype=torch.float32, device="cpu")

    def step(tables: list[list[int]], cached: list[int], feeds: list[int], ids: torch.Tensor) -> torch.Tensor:
        md = AttentionMetadata.build(block_size=BLOCK, block_tables=tables, cached_lens=cached, query_lens=feeds)
        return model.logits(model(ids, md.positions, md, cache))

    step([A], [0], [A_CACHED], decode_tokens[:A_CACHED])
    step([LONG], [0], [CHUNK_AT], long_tokens[:CHUNK_AT])
    new, chunk = decode_tokens[A_CACHED:], long_tokens[CHUNK_AT:]
    shallow = step([A, SHORT], [A_CACHED, 0], [1, CHUNK], torch.cat([new, chunk]))  # a fresh prompt's first chunk
    deep = step([A, LONG], [A_CACHED, CHUNK_AT], [1, CHUNK], torch.cat([new, chunk]))
    assert torch.equal(shallow[0], deep[0])
    assert not torch.allclose(shallow[-1], deep[-1], atol=1e-3), "liveness: the chunks' own rows differ"


@pytest.mark.parametrize("attention_path", PATHS, indirect=True)
@pytest.mark.parametrize("sliding_window", [None, 8])
@torch.no_grad()
def test_a_chunks_rows_equal_the_unchunked_prefills(sliding_window, attention_path):
    config = ModelConfig(**{**CONFIG.__dict__, "sliding_window": sliding_window})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 300, (41,), generator=gen)
    other = torch.randint(0, 300, (A_CACHED + 1,), generator=gen)
    table = list(range(20, 31))  # 11 blocks, 44 slots
    cache = PagedKVCache(KVShape.of(config), num_blocks=40, block_size=BLOCK, dtype=torch.float32, device="cpu")

    def step(tables: list[list[int]], cached: list[int], feeds: list[int], ids: torch.Tensor) -> torch.Tensor:
        md = AttentionMetadata.build(block_size=BLOCK, block_tables=tables, cached_lens=cached, query_lens=feeds,
                                     sliding_window=sliding_window)
        return model.logits(model(ids, md.positions, md, cache))

    whole = step([table], [0], [41], prompt)
    step([A], [0], [A_CACHED], other[:A_CACHED])
    # Chunks of 9, 13 and 19 tokens: every boundary inside a block; the later two beside a decode.
    rows = [step([table], [0], [9], prompt[:9])]
    rows.append(step([A, table], [A_CACHED, 9], [1, 13], torch.cat([other[A_CACHED:], prompt[9:22]]))[1:])
    rows.append(step([table, A], [22, A_CACHED + 1], [19, 1], torch.cat([prompt[22:], other[:1]]))[:-1])
    chunked = torch.cat(rows)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    reference = model.logits(model(prompt[None], torch.arange(41)[None]))[0]  # plain causal, nothing cached
    torch.testing.assert_close(whole, reference, rtol=1e-5, atol=1e-5)
    if sliding_window is not None:  # liveness: the window really cuts
        unwindowed = LlamaForCausalLM(CONFIG).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert not torch.allclose(unwindowed.logits(unwindowed(prompt[None], torch.arange(41)[None]))[0, -1],
                                  reference[-1], atol=1e-3)


class RecordingAttention:
    """Stands in for torch.nn.functional inside engine/model/attention.py and for the CPU's one-query
    decode kernel: records the shapes (and SDPA's masks) each attention call receives, then computes it."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []  # (batch, queries, keys) per call
        self.masks: list[object] = []                # each SDPA call's attn_mask
        self._decode_kernel = attention.Attention._decode_attention_float32_math

    def scaled_dot_product_attention(self, query: torch.Tensor, key: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        self.calls.append((query.shape[0], query.shape[2], key.shape[2]))
        self.masks.append(kwargs.get("attn_mask"))
        return torch.nn.functional.scaled_dot_product_attention(query, key, *args, **kwargs)

    def decode_kernel(self, layer: attention.Attention, q: torch.Tensor, keys: torch.Tensor, *args) -> torch.Tensor:
        self.calls.append((keys.shape[0], 1, keys.shape[2]))  # keys [B, Hkv, T, D], one query per row
        return self._decode_kernel(layer, q, keys, *args)


@torch.no_grad()
def test_a_decode_beside_a_deep_chunk_attends_its_own_keys_only(monkeypatch):
    """The torch path's split (the native op's rows read their own keys only by construction:
    tests/kernels/test_cpu_paged_attention.py's chunks read a cache holding NaN past them)."""
    monkeypatch.setattr(attention, "native_attention", lambda device: False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).eval()
    cache = PagedKVCache(KVShape.of(CONFIG), num_blocks=NUM_BLOCKS, block_size=BLOCK, dtype=torch.float32, device="cpu")
    recorder = RecordingAttention()
    monkeypatch.setattr(attention, "F", recorder)
    monkeypatch.setattr(attention.Attention, "_decode_attention_float32_math",
                        lambda layer, *args: recorder.decode_kernel(layer, *args))
    md = AttentionMetadata.build(block_size=BLOCK, block_tables=[A, LONG], cached_lens=[A_CACHED, CHUNK_AT],
                                 query_lens=[1, CHUNK])
    model(torch.arange(CHUNK + 1), md.positions, md, cache)

    decode_keys = len(A) * BLOCK  # its 38 tokens' blocks
    per_layer = [(1, 1, decode_keys), (1, CHUNK, CHUNK_AT + CHUNK)]
    assert recorder.calls == per_layer * CONFIG.num_hidden_layers, \
        "each decode attends one query over its own blocks, each chunk its own history and itself"
    attended = sum(b * q * k for b, q, k in recorder.calls)
    assert attended == CONFIG.num_hidden_layers * (decode_keys + CHUNK * (CHUNK_AT + CHUNK))
    # The chunk's 200 cached keys come before all of its queries: SDPA is told so (lower-right causal),
    # not handed a mask tensor, with which it would run GQA on its float32 math kernel only.
    from torch.nn.attention.bias import CausalBias, CausalVariant  # imports torch._dynamo: not at collection

    assert len(recorder.masks) == CONFIG.num_hidden_layers
    assert all(isinstance(mask, CausalBias) and mask.variant is CausalVariant.LOWER_RIGHT
               for mask in recorder.masks), recorder.masks
