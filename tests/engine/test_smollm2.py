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
from tests.hf_gguf import hf_model

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
    return hf_model(smollm2_gguf)


def full_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    model = engine.loaded.model
    with torch.no_grad():
        return model.logits(model(torch.tensor([ids]), torch.arange(len(ids))[None]))[0]


@pytest.fixture(scope="module")
def greedy(ours, prompts) -> list[list[int]]:
    params = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0, ignore_eos=True)
    return [result.token_ids for result in ours.generate(prompts, params)]


@pytest.fixture(scope="module")
def their_logits(theirs, prompts, greedy) -> list[torch.Tensor]:
    """transformers' logits over each prompt followed by our greedy tokens, in one forward each: its
    argmax at every position is what its own greedy decoding would pick after that prefix, so a match
    at every position is the same as `generate` giving our tokens, at a fraction of the cost."""
    with torch.no_grad():
        return [theirs(torch.tensor([ids + tokens])).logits[0] for ids, tokens in zip(prompts, greedy)]


def test_logits_match_transformers_on_the_same_file(ours, prompts, their_logits):
    for ids, expected in zip(prompts, their_logits):
        expected = expected[: len(ids)]
        got = full_logits(ours, ids)
        assert (got - expected).abs().max() <= RELATIVE_TOLERANCE * expected.abs().max()


def test_64_greedy_tokens_match_transformers_greedy_choice(ours, prompts, greedy, their_logits):
    for ids, tokens, logits in zip(prompts, greedy, their_logits):
        assert len(tokens) == GREEDY_TOKENS
        # The logits at position p predict the token at p + 1: the prompt's last one predicts our first.
        their_choice = logits[len(ids) - 1: -1].argmax(dim=-1).tolist()
        assert tokens == their_choice, ours.tokenizer.decode(ids)


def test_a_chat_answer_is_a_real_answer(ours):
    [result] = ours.generate([ours.tokenizer.encode_chat(CHATS[0])], SamplingParams(max_tokens=48, temperature=0))
    assert "list" in result.text.lower() and result.text.isascii()  # not the demo model's gibberish


def test_the_quantized_path_serves_the_same_weights(smollm2_gguf, ours, prompts, greedy):
    quantized = Engine(EngineConfig(model=str(smollm2_gguf), weights="quantized", max_model_len=1024))
    reference = full_logits(ours, prompts[1])
    assert (full_logits(quantized, prompts[1]) - reference).abs().max() <= 1e-5 * reference.abs().max()
    # One at a time, so each decode step takes the kernel's one-row route (a batch dequantizes per
    # call); a chat prompt and a raw one, 16 tokens: fp32 through that kernel is slow (a scalar loop).
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for row in (0, 3):  # greedy's first 16 tokens are what a 16-token greedy run of ours gives
        assert quantized.generate([prompts[row]], params)[0].token_ids == greedy[row][:16]
