"""GGUF files as a model source: the same model as its HF twin, read as transformers reads it, and
refused with a message naming the problem when it cannot be served.

Tiny random checkpoints are written as GGUF by tests/gguf_files.py (llama.cpp's names and Q/K row
permutation); their HF twin directory holds the same float weights, so a GGUF read with F32 tensors
must give exactly the twin's logits. transformers' own GGUF reader is the independent reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from engine.loading.loader import ModelLoadError, load_model
from engine.loading.model_files import load_model_config, load_tokenizer
from tests.gguf_files import copy_gguf, write_gguf

IDS = torch.tensor([5, 17, 300, 42, 1000, 7, 4095, 0, 63])


def logits(loaded, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model.logits(loaded.model(ids[None], torch.arange(len(ids))[None]))[0]


@pytest.mark.parametrize("model_type, overrides", [("llama", {}), ("qwen2", {}), ("mistral", {}),
                                                    ("llama", {"tie_word_embeddings": True})],
                         ids=["llama", "qwen2", "mistral", "llama-tied"])
def test_f32_gguf_is_exactly_its_hf_twin(tiny_gguf, model_type, overrides):
    path, twin = tiny_gguf(model_type, **overrides)
    ours, reference = load_model(path, weights="dequantized"), load_model(twin)
    assert ours.config.tie_word_embeddings == reference.config.tie_word_embeddings
    assert ours.config.attention_bias == reference.config.attention_bias
    assert torch.equal(logits(ours), logits(reference))


def test_a_loaded_model_leaves_the_files_vocabulary_and_pages_behind_and_loads_again(tiny_gguf):
    """The cached checkpoint drops its parsed vocabulary arrays and the mapped pages once the model is
    loaded (Gemma 3: about 430 MB of RSS); its tokenizer and config stay, and a second load reads the
    tensors again to the same logits."""
    from engine.loading.model_files import gguf_checkpoint
    from engine.loading.gguf_model import VOCABULARY_FIELDS

    path, _ = tiny_gguf("llama", seed=4)
    checkpoint = gguf_checkpoint(path)
    assert "tokenizer.ggml.tokens" in checkpoint._file.metadata, "liveness: the file has a vocabulary"
    first = load_model(path, weights="dequantized")
    assert gguf_checkpoint(path) is checkpoint, "the checkpoint stays cached"
    assert not set(VOCABULARY_FIELDS) & set(checkpoint._file.metadata)
    assert load_tokenizer(path) is first.tokenizer and load_model_config(path) == first.config
    assert torch.equal(logits(load_model(path, weights="dequantized")), logits(first))


def test_transformers_reads_the_same_model_from_the_file(tiny_gguf):
    path, _ = tiny_gguf("llama", seed=3)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    with torch.no_grad():
        expected = theirs(IDS[None]).logits[0]
    torch.testing.assert_close(logits(load_model(path, weights="dequantized")), expected, rtol=1e-4, atol=1e-4)


def test_config_and_eos_come_from_the_metadata(tiny_gguf):
    path, twin = tiny_gguf("llama")
    config = load_model_config(path)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.max_position_embeddings) == (3, 4, 2, 16, 256)
    # llama.cpp stores eps as float32; HF reads it back as that float32 value, and so do we.
    assert config.rms_norm_eps == float(np.float32(1e-6))
    loaded = load_model(path, weights="dequantized")
    assert loaded.eos_token_ids == frozenset([load_tokenizer(twin).token_id("<|endoftext|>")])


def test_the_chat_template_comes_from_the_metadata(tiny_gguf):
    path, twin = tiny_gguf("llama")
    messages = [{"role": "user", "content": "hi"}]
    assert load_tokenizer(path).apply_chat_template(messages) == load_tokenizer(twin).apply_chat_template(messages)


@pytest.mark.parametrize("damage, fragments", [
    (dict(drop_keys={"llama.block_count"}), ["metadata key 'llama.block_count' is missing"]),
    (dict(set_values={"tokenizer.ggml.model": "t5"}), ["tokenizer.ggml.model 't5' is not supported"]),
    (dict(set_values={"tokenizer.ggml.pre": "made-up"}), ["tokenizer.ggml.pre 'made-up' is not supported"]),
    (dict(drop_tensors={"blk.1.ffn_up.weight"}), ["lacks tensor", "model.layers.1.mlp.up_proj.weight"]),
    (dict(rename={"blk.0.ffn_up.weight": "blk.0.ffn_upp.weight"}), ["unexpected tensor 'blk.0.ffn_upp.weight'"]),
    (dict(reshape={"blk.0.attn_v.weight": 16}), ["model.layers.0.self_attn.v_proj.weight", "has shape (16, 64)",
                                                 "(32, 64)"]),
], ids=["missing-key", "tokenizer-model", "pre-tokenizer", "missing-tensor", "unknown-tensor",
        "wrong-shape"])
def test_a_file_we_cannot_serve_is_refused_by_name(tiny_gguf, tmp_path, damage, fragments):
    path, _ = tiny_gguf("llama")
    damaged = copy_gguf(path, tmp_path / "damaged.gguf", **damage)
    with pytest.raises(ModelLoadError) as error:
        load_model(damaged, weights="dequantized")
    for fragment in fragments:
        assert fragment in str(error.value)


def test_an_architecture_we_do_not_run_is_refused_by_name(tiny_checkpoint, tmp_path):
    path = write_gguf(tiny_checkpoint("llama"), tmp_path / "neox.gguf", architecture="gptneox")
    with pytest.raises(ModelLoadError, match="architecture 'gptneox' is not supported; supported: llama"):
        load_model(path)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_model(fake)


def test_an_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match="neither a known name \\('demo', 'smollm2', 'gemma3'\\)"):
        load_model("smollm3")
