"""The real Gemma 3 270M file (Q4_K_M: Q4_K, Q6_K, Q5_0 and Q8_0 tensors; a SentencePiece vocabulary of
262,144 pieces; windowed and full layers) against HF transformers reading the same file with its own
GGUF reader, both with the weights dequantized to float32.

HF is loaded once for the module (its reader dequantizes every tensor in Python; tests/hf_gguf.py), and so
is ours.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.tokenizer import NO_CHAT_TEMPLATE, TokenizerError
from tests.hf_gguf import hf_model, hf_tokenizer

pytestmark = [pytest.mark.gemma3, pytest.mark.slow]

RELATIVE_TOLERANCE = 1e-4
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n\nx =", "Water boils at"]
# Ordinary text, whitespace runs, non-Latin scripts, emoji, and characters no piece covers (byte fallback).
TEXTS = ["The capital of France is", "  two  spaces\tand a tab\n\nnew lines", "a , b . c!",
         "Ünïcödé façade — naïve 日本語のテキスト", "🤖🚀 emoji", "\u0378\U0010fffd unassigned", "<start_of_turn>user",
         "", " leading space", "x" * 40]


@pytest.fixture(scope="module")
def hf(gemma3_gguf):
    return hf_model(gemma3_gguf)


@pytest.fixture(scope="module")
def hf_tok(gemma3_gguf):
    return hf_tokenizer(gemma3_gguf)


@pytest.fixture(scope="module")
def engine(gemma3_gguf):
    return Engine(EngineConfig(model=str(gemma3_gguf), weights="dequantized", dtype="float32"))


@pytest.fixture(scope="module")
def ours(engine):
    """The engine's own model and tokenizer (one load of the file for the module)."""
    return engine.loaded


@pytest.fixture(scope="module")
def prompts(ours) -> list[list[int]]:
    return [ours.tokenizer.encode(prompt) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def greedy(engine, prompts):
    return engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))


@pytest.fixture(scope="module")
def their_logits(hf, prompts, greedy) -> list[torch.Tensor]:
    """HF's logits over each prompt followed by our greedy tokens, one forward each: its argmax at every
    position is what its own greedy decoding picks after that prefix, so agreeing at every position is
    `generate` giving our tokens, at a fraction of the cost (causal: the prompt's logits are unchanged)."""
    with torch.no_grad():
        return [hf(torch.tensor([ids + result.token_ids])).logits[0] for ids, result in zip(prompts, greedy)]


@torch.no_grad()
def test_logits_match_hf_on_every_prompt(ours, prompts, their_logits):
    for text, ids, logits in zip(PROMPTS, prompts, their_logits):
        expected = logits[:len(ids)]
        got = ours.model.logits(ours.model(torch.tensor([ids]), torch.arange(len(ids))[None]))[0]
        assert float((got - expected).abs().max() / expected.abs().max()) < RELATIVE_TOLERANCE, text


def test_greedy_tokens_are_hfs_greedy_choice_for_32_tokens_from_6_prompts(ours, prompts, greedy, their_logits):
    for ids, result, logits in zip(prompts, greedy, their_logits):
        # The logits at position p predict the token at p + 1: the prompt's last one predicts our first.
        their_choice = logits[len(ids) - 1: -1].argmax(dim=-1).tolist()
        assert len(result.token_ids) == 32 and len(set(their_choice)) > 3, "liveness: not a constant run"
        assert result.token_ids == their_choice, ours.tokenizer.decode(ids)
    assert greedy[0].text.startswith(" the capital of the country of France.")


# Served quantized, a token's logprob moves against the dequantized model's (the int8 activations of the
# quantized kernels, bfloat16; seen: at most 0.22). So where the dequantized model's best two tokens are
# closer than that, either route may pick either: the served token must be the dequantized model's best
# or within this of it, and nearly always its best.
SERVED_LOGPROB_TOLERANCE = 0.35


def test_k_quants_served_quantized_follow_the_dequantized_models_choices(gemma3_gguf, ours):
    """As `make run` serves the file (quantized, bfloat16, each layer one fused native call): its Q4_K and
    Q6_K projections stay quantized on the native kernels, and each of its greedy tokens (32 from each of 6
    prompts) is the choice of the same file dequantized (the module's float32 model), read over the served
    tokens, or a near tie there. Comparing two greedy runs token for token would test which side of a near
    tie each arithmetic lands on, which changes with the machine's kernels."""
    from engine.kernels import cpu
    from engine.model.quantized import QuantizedLinear

    if not cpu.native_available():
        pytest.skip(f"native CPU kernels unavailable: {cpu.unavailable_reason()}")
    served = Engine(EngineConfig(model=str(gemma3_gguf), weights="quantized", dtype="bfloat16"))
    assert served.runner.loaded.model.fused is not None, "liveness: Gemma's block on the fused route"
    kinds = {module.qtype.name for module in served.runner.loaded.model.modules() if isinstance(module, QuantizedLinear)}
    assert {"Q4_K", "Q6_K"} <= kinds, f"liveness: the K-quants are served quantized ({kinds})"
    reference = ours.model
    prompts = [served.runner.loaded.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=1)
    best_choices = 0
    for text, ids, mine in zip(PROMPTS, prompts, served.generate(prompts, params)):
        tokens = ids + mine.token_ids
        with torch.no_grad():
            logits = reference.logits(reference(torch.tensor([tokens]), torch.arange(len(tokens))[None]))[0]
        theirs = logits[len(ids) - 1:-1].float().log_softmax(-1)  # [32, V]: the choice of each served token
        chosen = theirs[torch.arange(len(mine.token_ids)), torch.tensor(mine.token_ids)]
        short = float((theirs.max(-1).values - chosen).max())
        assert short <= SERVED_LOGPROB_TOLERANCE, f"{text!r}: a served token is {short:.3f} short of the best"
        gap = max(abs(a.logprob - b) for a, b in zip(mine.logprobs, chosen.tolist()))
        assert gap <= SERVED_LOGPROB_TOLERANCE, f"{text!r}: a chosen token's logprob moved {gap:.3f}"
        best_choices += int((chosen == theirs.max(-1).values).sum())
    assert best_choices >= 0.95 * 32 * len(PROMPTS), f"only {best_choices} served tokens are the reference's best"


def test_the_tokenizer_encodes_and_decodes_as_hf_does(ours, hf_tok):
    fallback = 0
    for text in TEXTS:
        ids = ours.tokenizer.encode(text)
        assert ids == hf_tok.encode(text), text
        assert ours.tokenizer.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True), text
        fallback += sum(1 for i in ids if hf_tok.convert_ids_to_tokens(i).startswith("<0x"))
    assert fallback >= 4, "liveness: some characters must go through the <0xNN> byte pieces"


def test_each_tokens_bytes_join_into_the_text(ours):
    """logprobs' `bytes`: spaces (U+2581 in the pieces) and byte-fallback pieces included."""
    for text in TEXTS:
        ids = ours.tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(ours.tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8"), text


def test_a_base_model_refuses_messages_by_name(ours):
    assert ours.tokenizer.chat_template is None
    with pytest.raises(TokenizerError, match="no chat template"):
        ours.tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert "base model" in NO_CHAT_TEMPLATE
