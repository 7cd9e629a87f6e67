"""The token embedding looked up in its GGUF rows (engine/model/quantized_embedding.py): the same bits as a
lookup in the dequantized table, one copy of the rows where the head is tied to it, and the float table
kept where a float head needs it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf", reason="gguf (the ggml block formats) is not installed")

from engine.loading.loader import load_model  # noqa: E402
from engine.model.quantized import QuantizedLinear  # noqa: E402
from engine.model.quantized_embedding import QuantizedEmbedding  # noqa: E402

needs_kernels = pytest.mark.usefixtures("native_cpu_kernels")  # the quantized head needs them


@pytest.mark.parametrize("table_qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_lookup_is_the_same_bits_as_in_the_dequantized_table(tiny_gguf, table_qtype, dtype):
    path, _ = tiny_gguf("llama", "Q4_1", seed=3, embedding_qtype=table_qtype, tie_word_embeddings=False)
    ours = load_model(path, weights="quantized", dtype=dtype).model.model.embed_tokens
    reference = load_model(path, weights="dequantized", dtype=dtype).model.model.embed_tokens
    assert isinstance(ours, QuantizedEmbedding), "liveness: the table is served quantized"
    ids = torch.tensor([[0, 5, 5, ours.num_embeddings - 1], [7, 1, 2, 3]])
    looked_up = ours(ids)
    assert looked_up.dtype == getattr(torch, dtype) and looked_up.shape == (2, 4, ours.embedding_dim)
    assert torch.equal(looked_up, reference(ids))


@needs_kernels
def test_a_tied_head_and_its_table_share_one_copy_of_the_rows(tiny_gguf):
    path, _ = tiny_gguf("llama", "Q4_1", seed=4, embedding_qtype="Q8_0", tie_word_embeddings=True)
    model = load_model(path, weights="quantized", dtype="bfloat16").model
    table = model.model.embed_tokens
    assert isinstance(table, QuantizedEmbedding) and model.lm_head is table.table
    assert isinstance(model.lm_head, QuantizedLinear)


def test_a_tied_table_stays_float_where_the_head_does(tiny_gguf):
    """In float32 the head is a float Linear (the torch route would dequantize the vocabulary at every
    call), and it shares the float table."""
    path, _ = tiny_gguf("llama", "Q4_1", seed=5, embedding_qtype="Q8_0", tie_word_embeddings=True)
    model = load_model(path, weights="quantized", dtype="float32").model
    assert isinstance(model.model.embed_tokens, torch.nn.Embedding)
    assert model.lm_head.weight is model.model.embed_tokens.weight
