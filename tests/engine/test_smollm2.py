"""SmolLM2-135M-Instruct, the chat's default model, against HF transformers reading the same GGUF file.

transformers' own GGUF reader (its dequantizers, its tensor mapping, its tokenizer conversion) is an
implementation independent of ours. With dequantized fp32 weights both compute the same model: logits
within 1e-4 of their scale and 64 greedy tokens identical, on raw text and on chat-templated prompts
with and without a system message. Our quantized path holds the same weights, so it must agree with
our dequantized one too. The file is fetched once per machine (tests/conftest.py: smollm2_gguf).
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

CHATS = [
    [{"role": "user", "content": "What is a Python list?"}],
    [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
RAW = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,"]
RELATIVE_TOLERANCE = 1e-4
GREEDY_TOKENS = 64


@pytest.fixture(scope="module")
def ours(smollm2_gguf):
    return Engine(EngineConfig(model=str(smollm2_gguf), weights="dequantized", max_model_len=1024))


@pytest.fixture(scope="module")
def prompts(ours) -> list[list[int]]:
    return [ours.tokenizer.encode_chat(chat) for chat in CHATS] + [ours.tokenizer.encode(text) for text in RAW]


@pytest.fixture(scope="module")
def theirs(smollm2_gguf):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                              dtype=torch.float32)
    return model.eval()


def full_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    model = engine.loaded.model
    with torch.no_grad():
        return model.logits(model(torch.tensor([ids]), torch.arange(len(ids))[None]))[0]


def test_logits_match_transformers_on_the_same_file(ours, theirs, prompts):
    for ids in prompts:
        with torch.no_grad():
            expected = theirs(torch.tensor([ids])).logits[0]
        got = full_logits(ours, ids)
        assert (got - expected).abs().max() <= RELATIVE_TOLERANCE * expected.abs().max()


def test_64_greedy_tokens_match_transformers_generate(ours, theirs, prompts):
    params = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0, ignore_eos=True)
    results = ours.generate(prompts, params)
    for ids, result in zip(prompts, results):
        x = torch.tensor([ids])
        # An explicit mask: without one, generate masks every prompt token equal to pad_token_id, and
        # this model's pad is <|im_end|>, which every chat prompt contains.
        with torch.no_grad():
            out = theirs.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY_TOKENS,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)
        assert result.token_ids == out[0, len(ids):].tolist(), ours.tokenizer.decode(ids)


def test_a_chat_answer_is_a_real_answer(ours):
    [result] = ours.generate([ours.tokenizer.encode_chat(CHATS[0])], SamplingParams(max_tokens=48, temperature=0))
    assert "list" in result.text.lower() and result.text.isascii()  # not the demo model's gibberish


def test_the_quantized_path_serves_the_same_weights(smollm2_gguf, ours, prompts):
    quantized = Engine(EngineConfig(model=str(smollm2_gguf), weights="quantized", max_model_len=1024))
    reference = full_logits(ours, prompts[1])
    assert (full_logits(quantized, prompts[1]) - reference).abs().max() <= 1e-5 * reference.abs().max()
    # One at a time, so each decode step takes the kernel's one-row route (a batch dequantizes per
    # call); a chat prompt and a raw one, 16 tokens: fp32 through that kernel is slow (a scalar loop).
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for ids in (prompts[0], prompts[3]):
        assert quantized.generate([ids], params)[0].token_ids == ours.generate([ids], params)[0].token_ids
