"""The shipped demo model: loads unchanged in HF transformers, matches it, and its report is honest."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from engine import Engine, EngineConfig, SamplingParams

PROMPTS = ["The list type", "Return a new dictionary", "If the file does not exist,", "x = [1, 2, 3]\n"]


@pytest.fixture(scope="module")
def reference(demo_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    # No EOS: HF then decodes every step like our ignore_eos (min_new_tokens would instead forbid the
    # EOS token, a different greedy path).
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(model="demo"))


def test_demo_directory_is_a_plain_hf_llama_checkpoint(demo_dir, reference):
    assert type(reference).__name__ == "LlamaForCausalLM"
    parameters = sum(p.numel() for p in reference.parameters())
    assert 5e6 <= parameters <= 15e6
    assert (demo_dir / "model.safetensors").stat().st_size <= 30 * 2**20


@torch.no_grad()
def test_demo_logits_match_hf(engine, reference):
    ids = torch.tensor([engine.tokenizer.encode(" ".join(PROMPTS))])
    expected = reference(ids).logits
    model = engine.loaded.model
    got = model.logits(model(ids, torch.arange(ids.shape[1])[None]))
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-4


def test_demo_greedy_decoding_matches_hf_generate(engine, reference):
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    for prompt, result in zip(PROMPTS, results):
        ids = torch.tensor([engine.tokenizer.encode(prompt)])
        with torch.no_grad():
            out = reference.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=0)
        assert result.token_ids == out[0, ids.shape[1]:].tolist(), prompt


def test_training_report_is_reproduced_by_the_shipped_weights(demo_dir, engine):
    report = json.loads((demo_dir / "training_report.json").read_text())
    assert math.isfinite(report["held_out_loss"])
    # A uniform guess over the vocabulary scores ln(4096) = 8.3; a model that learned English is far below.
    assert report["held_out_loss"] < 5.0
    for prompt, sample in report["greedy_samples"].items():
        [result] = engine.generate([prompt], SamplingParams(max_tokens=48, temperature=0))
        assert prompt + result.text == sample
