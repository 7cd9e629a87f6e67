"""docs/ARCHITECTURE.md's "How to add a model family", followed once: a family declared as one registry entry
(a Llama variant under a model_type and GGUF architecture of its own, with one declared difference, the
embedding scaled by sqrt(hidden_size)) loads through the normal paths, an HF directory and a GGUF file, and
runs a forward and a generation; no other file of the engine learns its name.

The difference must reach the model: the variant's logits differ from the same weights read as plain
llama, and equal those of a llama config given the same embedding scale by hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.loader import ModelLoadError, load_model
from engine.model.config import ModelConfig
from engine.model.architectures import registry
from engine.model.architectures.family import Family
from tests.gguf_files import write_gguf

VARIANT = Family(model_type="scaled_llama", gguf_architecture="scaled_llama", scaled_embedding=True)
IDS = torch.tensor([5, 17, 300, 42, 9])


@pytest.fixture
def registered(monkeypatch):
    """The variant in the registry for this test only."""
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    registry.register(VARIANT)
    return VARIANT


@pytest.fixture
def checkpoints(tiny_checkpoint, tmp_path) -> tuple[Path, Path]:
    """(the tiny llama directory, a copy of it whose config.json names the variant)."""
    llama = tiny_checkpoint("llama")
    variant = tmp_path / "variant"
    variant.mkdir()
    for path in llama.iterdir():
        (variant / path.name).write_bytes(path.read_bytes())
    config = json.loads((llama / "config.json").read_text())
    (variant / "config.json").write_text(json.dumps({**config, "model_type": VARIANT.model_type}))
    return llama, variant


def logits(loaded) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model.logits(loaded.model(IDS[None], torch.arange(len(IDS))[None]))


def test_an_unregistered_family_is_refused_by_name(checkpoints):
    """Control: without its entry the variant is an unknown model_type, so the loads below are the entry's doing."""
    with pytest.raises(ModelLoadError, match="unsupported model_type 'scaled_llama'"):
        load_model(checkpoints[1])


def test_the_entry_is_read_from_an_hf_directory_and_its_difference_reaches_the_forward(registered, checkpoints):
    llama_dir, variant_dir = checkpoints
    variant, llama = load_model(variant_dir), load_model(llama_dir)
    assert variant.config.model_type == "scaled_llama"
    assert variant.config.embedding_multiplier == pytest.approx(variant.config.hidden_size ** 0.5)
    assert dataclasses.replace(variant.config, model_type="llama", embedding_multiplier=None) == llama.config, \
        "the variant differs from llama in its declared difference only"
    ours = logits(variant)
    assert torch.isfinite(ours).all()
    assert not torch.allclose(ours, logits(llama), atol=1e-3), "the scaled embedding changes the logits"
    llama.model.config = dataclasses.replace(llama.config, embedding_multiplier=variant.config.embedding_multiplier)
    torch.testing.assert_close(ours, logits(llama), rtol=0, atol=0)


def test_the_entry_is_read_from_a_gguf_file_of_its_architecture(registered, checkpoints, tmp_path):
    _, variant_dir = checkpoints
    path = write_gguf(variant_dir, tmp_path / "variant.gguf", architecture=VARIANT.gguf_architecture)
    from_gguf, from_hf = load_model(path), load_model(variant_dir)
    assert from_gguf.config.model_type == "scaled_llama" and from_gguf.config.embedding_multiplier is not None
    torch.testing.assert_close(logits(from_gguf), logits(from_hf), rtol=1e-5, atol=1e-5)
    engine = Engine(EngineConfig(model=str(path)))
    [result] = engine.generate([IDS.tolist()], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(result.token_ids) == 4


def test_a_gguf_file_of_an_unregistered_architecture_is_refused(checkpoints, tmp_path):
    path = write_gguf(checkpoints[1], tmp_path / "variant.gguf", architecture=VARIANT.gguf_architecture)
    with pytest.raises(ModelLoadError, match="architecture 'scaled_llama' is not supported"):
        load_model(path)


def test_a_family_cannot_take_a_registered_name(registered):
    with pytest.raises(ValueError, match="registered already"):
        registry.register(Family(model_type="llama"))
    with pytest.raises(ValueError, match="registered already"):
        registry.register(Family(model_type="another", gguf_architecture="llama"))
    assert ModelConfig.from_hf_dict({"model_type": "scaled_llama", "vocab_size": 8, "hidden_size": 16,
                                     "intermediate_size": 8, "num_hidden_layers": 1,
                                     "num_attention_heads": 2}).embedding_multiplier == 4.0
