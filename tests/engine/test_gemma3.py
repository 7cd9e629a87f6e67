"""The real Gemma 3 270M file (Q4_K_M: Q4_K, Q6_K, Q5_0 and Q8_0 tensors; a SentencePiece vocabulary of
262,144 pieces; windowed and full layers) against HF transformers reading the same file with its own
GGUF reader, both with the weights dequantized to float32.

HF is loaded once for the module (its reader dequantizes every tensor in Python), and so is ours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import gguf
import pytest
import torch
import transformers

from engine import Engine, EngineConfig, SamplingParams
from engine.loading.tokenizer import NO_CHAT_TEMPLATE, TokenizerError

pytestmark = [pytest.mark.gemma3, pytest.mark.slow]

RELATIVE_TOLERANCE = 1e-4
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n\nx =", "Water boils at"]
# Ordinary text, whitespace runs, non-Latin scripts, emoji, and characters no piece covers (byte fallback).
TEXTS = ["The capital of France is", "  two  spaces\tand a tab\n\nnew lines", "a , b . c!",
         "Ünïcödé façade — naïve 日本語のテキスト", "🤖🚀 emoji", "\u0378\U0010fffd unassigned", "<start_of_turn>user",
         "", " leading space", "x" * 40]


@pytest.fixture(scope="module")
def one_header_parse(gemma3_gguf) -> Iterator[Callable[[], AbstractContextManager[None]]]:
    """HF opens the file anew for the config, for the weights and for the tokenizer, and gguf's reader
    parses its 262,144-piece vocabulary field by field each time (about 20 s a time here). While HF
    loads, its reader of this file is one reader, parsed once: HF's own reading all the same."""
    parsed = gguf.GGUFReader(gemma3_gguf)
    real_reader = gguf.GGUFReader

    def reader(path, *args, **kwargs):
        return parsed if Path(path) == gemma3_gguf and not args and not kwargs else real_reader(path, *args, **kwargs)

    @contextmanager
    def parsed_once() -> Iterator[None]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gguf, "GGUFReader", reader)
            yield

    yield parsed_once


@pytest.fixture(scope="module")
def hf(gemma3_gguf, one_header_parse):
    with one_header_parse():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # as our ignore_eos: every step decodes
    return model


@pytest.fixture(scope="module")
def hf_tokenizer(gemma3_gguf, one_header_parse):
    with one_header_parse():
        return transformers.AutoTokenizer.from_pretrained(str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name)


@pytest.fixture(scope="module")
def engine(gemma3_gguf):
    return Engine(EngineConfig(model=str(gemma3_gguf), weights="dequantized", dtype="float32"))


@pytest.fixture(scope="module")
def ours(engine):
    """The engine's own model and tokenizer (one load of the file for the module)."""
    return engine.loaded


@torch.no_grad()
def test_logits_match_hf_on_every_prompt(ours, hf):
    for prompt in PROMPTS:
        ids = torch.tensor([ours.tokenizer.encode(prompt)])
        expected = hf(ids).logits[0]
        got = ours.model.logits(ours.model(ids, torch.arange(ids.shape[1])[None]))[0]
        assert float((got - expected).abs().max() / expected.abs().max()) < RELATIVE_TOLERANCE, prompt


def test_greedy_tokens_equal_hf_for_32_tokens_from_6_prompts(engine, ours, hf):
    prompts = [ours.tokenizer.encode(p) for p in PROMPTS]
    results = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    for prompt, result in zip(prompts, results):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
        expected = out[0, len(prompt):].tolist()
        assert len(set(expected)) > 3, "liveness: the reference must not be a constant run"
        assert result.token_ids == expected, ours.tokenizer.decode(prompt)
    assert results[0].text.startswith(" the capital of the country of France.")


# Each chosen token's logprob, served quantized against the dequantized bfloat16 model: the int8 activations
# of the quantized kernels and the fused route's fp32 residual (seen: at most 0.19).
SERVED_LOGPROB_TOLERANCE = 0.35


def test_k_quants_served_quantized_give_the_dequantized_models_greedy_tokens(gemma3_gguf):
    """As `make run` serves the file (quantized, bfloat16, each layer one fused native call): its Q4_K and
    Q6_K projections stay quantized on the native kernels, and the greedy tokens are those of the same file dequantized to bfloat16, 32 tokens
    from each of 6 prompts. (Against the fp32 model, bfloat16 itself parts at near-ties on two prompts.)"""
    from engine.kernels import cpu
    from engine.model.quantized import QuantizedLinear

    if not cpu.native_available():
        pytest.skip(f"native CPU kernels unavailable: {cpu.unavailable_reason()}")
    served = Engine(EngineConfig(model=str(gemma3_gguf), weights="quantized", dtype="bfloat16"))
    assert served.runner.loaded.model.fused is not None, "liveness: Gemma's block on the fused route"
    kinds = {module.qtype.name for module in served.runner.loaded.model.modules() if isinstance(module, QuantizedLinear)}
    assert {"Q4_K", "Q6_K"} <= kinds, f"liveness: the K-quants are served quantized ({kinds})"
    dequantized = Engine(EngineConfig(model=str(gemma3_gguf), weights="dequantized", dtype="bfloat16"))
    prompts = [served.runner.loaded.tokenizer.encode(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=1)
    for text, mine, theirs in zip(PROMPTS, served.generate(prompts, params), dequantized.generate(prompts, params)):
        assert mine.token_ids == theirs.token_ids, text
        gap = max(abs(a.logprob - b.logprob) for a, b in zip(mine.logprobs, theirs.logprobs))
        assert gap <= SERVED_LOGPROB_TOLERANCE, f"{text!r}: a chosen token's logprob moved {gap:.3f}"


def test_the_tokenizer_encodes_and_decodes_as_hf_does(ours, hf_tokenizer):
    fallback = 0
    for text in TEXTS:
        ids = ours.tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text), text
        assert ours.tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True), text
        fallback += sum(1 for i in ids if hf_tokenizer.convert_ids_to_tokens(i).startswith("<0x"))
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
