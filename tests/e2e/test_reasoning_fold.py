"""A thinking model's reasoning folded away on the chat page (static/chat/reasoning.js), in a real headless
Chromium against a real Daphne: a stored reply that opens with a `<think>` block shows it in a closed
`<details>` before the answer, as plain text, and the answer alone as the message's markdown; a reply
without one is rendered as before."""

from __future__ import annotations

import pytest

from tests.e2e.test_chat_render import open_stored_reply
from tests.users import unique_name

THOUGHT = "<think>\nThe user wants **a city**. <b>Paris</b> it is.\n</think>\n\nIt is **Paris**."


@pytest.fixture(scope="module")
def render_server(inprocess_daphne):
    """The session's in-process Daphne (rendering needs no Celery) and its database file."""
    return f"http://{inprocess_daphne.address}", inprocess_daphne.db_path


def test_a_replys_reasoning_is_folded_before_its_answer(browser, render_server):
    page = open_stored_reply(browser, render_server, unique_name("thinker"), THOUGHT)
    article = page.locator("article.assistant")
    fold = article.locator("details.reasoning")
    assert fold.count() == 1 and fold.get_attribute("open") is None, "folded: closed until opened"
    assert fold.locator(".reasoning-text").text_content() == "\nThe user wants **a city**. <b>Paris</b> it is.\n"
    assert fold.locator("b").count() == 0, "the reasoning is plain text"
    assert article.locator(".content strong").inner_text() == "Paris"
    assert "think" not in article.locator(".content").inner_text()
    fold.locator("summary").click()
    assert fold.get_attribute("open") is not None


def test_a_reply_without_a_thinking_block_has_no_fold(browser, render_server):
    page = open_stored_reply(browser, render_server, unique_name("plain"), "Just **Paris**, <think> later.")
    article = page.locator("article.assistant")
    assert article.locator("details.reasoning").count() == 0
    assert article.locator(".content strong").inner_text() == "Paris"
