"""A new user asks the default model a question in a real Chromium: the reply streamed into the page
is the engine's own greedy generation of the same templated prompt (SmolLM2 served in-process, by the
session's shared Daphne: tests/conftest.py, smollm2_daphne)."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.e2e.conftest import signed_up_in_a_new_conversation

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]
QUESTION = "What is a Python list?"
MAX_TOKENS = 40


def test_a_new_user_gets_the_default_models_greedy_answer(browser, smollm2_daphne):
    base = f"http://{smollm2_daphne.address}"
    page = signed_up_in_a_new_conversation(browser, base, "newcomer")
    page.click("details summary")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", str(MAX_TOKENS))
    page.fill("#input", QUESTION)
    page.click("#send")
    page.locator("article.assistant .meta").wait_for(timeout=120_000)  # shown when the reply ends
    shown = page.locator("article.assistant .content").inner_text()

    engine = Engine(EngineConfig(model="smollm2"))
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": QUESTION}])
    [expected] = engine.generate([prompt], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    assert "list" in expected.text.lower(), "liveness: the real model answers the question"
    # The page renders markdown; compare the words as a reader sees them.
    assert shown.split() == expected.text.split()
