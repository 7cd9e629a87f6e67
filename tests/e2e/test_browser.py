"""A real headless Chromium (Debian's, driven by Playwright) against a real Daphne: sign up, chat,
watch tokens stream, stop, reload; a second user can open the first user's conversation neither by
URL nor over the socket; the composer's keys; managing a conversation (settings, system prompt,
title, reply versions, export, rename, defaults, search, delete)."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.conftest import new_page, sign_up, signed_up_in_a_new_conversation
from tests.users import unique_name

# For what the page and the web side alone do (rendering, the composer, managing conversations): the
# Celery half of daphne_server would repeat it at several seconds a test. Streaming, stopping, a busy
# conversation and the delta rendering run on both transports.
web_side_only = pytest.mark.parametrize("daphne_server", ["inprocess"], indirect=True)


def test_sign_up_chat_stream_stop_reload_and_privacy(browser, daphne_server):
    base = f"http://{daphne_server[0]}"
    alice = signed_up_in_a_new_conversation(browser, base, unique_name("alice"))
    conversation_url = alice.url

    alice.click("details summary")  # the sampling controls
    alice.fill("#max_tokens", "")  # none: the reply runs to the model's length, long after the stop
    alice.fill("#temperature", "0")
    alice.fill("#input", "Tell me about lists")
    alice.click("#send")
    streaming = alice.locator("article.assistant[data-streaming]")
    streaming.wait_for()
    # Tokens arrive one after another: the reply grows while it is still streaming.
    alice.wait_for_function("document.querySelector('article.assistant[data-streaming] .content').textContent.length > 0")
    first = streaming.inner_text()
    alice.wait_for_function(f"document.querySelector('article.assistant .content').textContent.length > {len(first)}")
    alice.click("#stop-button")
    meta = alice.locator("article.assistant .meta")
    meta.wait_for()
    assert "canceled" in meta.inner_text()
    partial = alice.locator("article.assistant .content").inner_text()

    alice.reload()
    assert alice.locator("article.user .content").inner_text() == "Tell me about lists"
    assert alice.locator("article.assistant .content").inner_text() == partial
    assert "canceled" in alice.locator("article.assistant .meta").inner_text()
    assert alice.locator("#title").inner_text() == "Tell me about lists"

    bob = new_page(browser)
    sign_up(bob, base, unique_name("eve"))
    assert bob.goto(conversation_url).status == 404
    conversation_id = conversation_url.rsplit("/", 1)[1]
    close_code = bob.evaluate("""id => new Promise(resolve => {
        const ws = new WebSocket(`ws://${location.host}/ws/chat/${id}`);
        ws.onopen = () => resolve("opened");
        ws.onclose = (event) => resolve(event.code);
    })""", conversation_id)
    assert close_code != "opened"


SYSTEM = "You are a pirate captain."
QUESTION = "Where is the hidden treasure buried?"


def set_field(page, selector: str, value: str) -> None:
    """Type a value as a person would: the field saves when it loses focus (its change event)."""
    page.fill(selector, value)
    page.locator(selector).blur()


def saved(page, what: str = "Saved for this conversation") -> None:
    page.wait_for_function(f"document.getElementById('settings-status').textContent === {what!r}")


def downloaded(page, selector: str) -> str:
    with page.expect_download() as info:
        page.click(selector)
    return open(info.value.path(), encoding="utf-8").read()


@web_side_only
def test_settings_system_prompt_title_export_rename_defaults_search_and_delete(browser, daphne_server):
    """Settings and a system prompt saved as they change and still there after a reload, the system
    prompt reaching the chat template (the engine was given its tokens), the title made from the first
    exchange, three versions of a regenerated reply navigable after a reload, export as JSON and
    Markdown (the downloaded files' contents), rename, the user's default for a new conversation,
    search, and delete after a confirmation: one walk, as page loads cost seconds here. The 404s for
    another user are tests/workbench/test_conversation_management.py's."""
    address, api_token = daphne_server
    base = f"http://{address}"
    page = signed_up_in_a_new_conversation(browser, base, unique_name("captain"))
    conversation_url = page.url
    # One model served: its name alone, no selector (tests/e2e/test_model_selector.py has several).
    assert page.locator("#model-name").inner_text() == "demo" and page.locator("#model-select").count() == 0
    page.click("#settings summary")
    set_field(page, "#system_prompt", SYSTEM)
    saved(page)
    set_field(page, "#temperature", "0")
    saved(page)
    set_field(page, "#max_tokens", "6")
    saved(page)
    refused = page.locator("#top_p")
    set_field(page, "#top_p", "7")  # a bad value is refused by name and not saved
    page.wait_for_function("document.getElementById('settings-status').textContent.startsWith('Not saved: top_p')")
    set_field(page, "#top_p", "1")
    saved(page)

    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.fill("#input", QUESTION)
    page.click("#send")
    page.locator("article.assistant .meta").wait_for()
    # The title comes from the first exchange once its reply is stored: on the page without a reload.
    assert page.locator("#title").inner_text() == QUESTION
    assert page.locator("aside li.current a").inner_text() == QUESTION

    # Regenerate twice: three versions of the reply, stepped through with < n/m >, kept over a reload.
    reply_article = page.locator("article.assistant").last
    # The reply as written (markdown.js keeps the source it rendered), not as rendered: the export holds that.
    def reply_source(article):
        return article.locator(".content").evaluate("el => markdownSource(el) ?? el.textContent")
    ids, texts = [reply_article.get_attribute("data-message-id")], [reply_source(reply_article)]
    for count in (2, 3):
        page.click("#regenerate")
        page.wait_for_function(f"""document.querySelector('article.assistant:last-of-type .version-count')
                                   ?.textContent === '{count}/{count}'""")
        ids.append(reply_article.get_attribute("data-message-id"))
        texts.append(reply_source(reply_article))
    assert len(set(ids)) == 3 and page.locator("article.assistant").count() == 1

    page.reload()
    page.click("#settings summary")
    assert (page.input_value("#system_prompt"), page.input_value("#temperature"), page.input_value("#max_tokens"),
            refused.input_value()) == (SYSTEM, "0", "6", "1"), "the settings survive a reload"
    assert reply_article.locator(".version-count").inner_text() == "3/3"
    assert reply_article.get_attribute("data-message-id") == ids[2]
    assert reply_article.get_by_role("button", name="Next version").is_disabled()
    with page.expect_navigation():
        reply_article.get_by_role("button", name="Previous version").click()
    assert reply_article.locator(".version-count").inner_text() == "2/3"
    assert (reply_article.get_attribute("data-message-id"), reply_source(reply_article)) == \
        (ids[1], texts[1])

    exported = json.loads(downloaded(page, "#export-json"))
    assert (exported["title"], exported["system_prompt"], exported["model"]) == (QUESTION, SYSTEM, "demo")
    assert exported["sampling"] == {"temperature": 0, "top_p": 1, "top_k": 0, "max_tokens": 6}
    user, reply = exported["messages"]  # as the page shows it: the second version
    assert user["content"] == QUESTION and reply["usage"]["completion_tokens"] == 6 and reply["content"] == texts[1]
    # The engine was given the system prompt through the template: its prompt is the templated
    # [system, user] pair, token for token as /tokenize renders it, not the user message alone.
    def tokens(messages):
        response = page.request.post(f"{base}/tokenize", data={"messages": messages},
                                     headers={"Authorization": f"Bearer {api_token}"})
        return response.json()["count"]
    question = {"role": "user", "content": QUESTION}
    assert reply["usage"]["prompt_tokens"] == tokens([{"role": "system", "content": SYSTEM}, question])
    assert reply["usage"]["prompt_tokens"] > tokens([question])
    markdown = downloaded(page, "#export-markdown")
    assert markdown.startswith(f"# {QUESTION}\n\n## System\n\n{SYSTEM}\n\n## User\n\n{QUESTION}\n\n## Assistant\n\n")
    assert reply["content"] in markdown

    page.click("#rename-button")
    page.fill("#rename-title", "Treasure hunt")
    page.click("#rename-save")
    page.wait_for_function("document.getElementById('title').textContent === 'Treasure hunt'")
    assert page.locator("aside li.current a").inner_text() == "Treasure hunt"

    page.click("#settings summary")
    page.click("#save-defaults")
    saved(page, "Saved as your default for new conversations")
    page.click("aside button[type=submit]")  # a new conversation starts from the user's default
    page.wait_for_url(re.compile(r".*/c/\d+$"))
    assert page.url != conversation_url
    assert (page.input_value("#system_prompt"), page.input_value("#max_tokens")) == (SYSTEM, "6")

    page.fill("#search-aside", "TREASURE buried")  # message text, any case
    page.press("#search-aside", "Enter")
    results = page.locator("#search-results li")
    results.first.wait_for()
    assert results.count() == 1 and results.first.locator("a").inner_text() == "Treasure hunt"
    assert "hidden treasure buried" in results.first.locator(".snippet").inner_text()
    results.first.locator("a").click()
    page.wait_for_url(conversation_url)

    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#delete-conversation")  # dismissed: nothing happens
    assert page.url == conversation_url and page.locator("#title").inner_text() == "Treasure hunt"
    messages: list[str] = []
    page.once("dialog", lambda dialog: (messages.append(dialog.message), dialog.accept()))
    page.click("#delete-conversation")
    page.wait_for_url(f"{base}/")
    assert "Treasure hunt" in messages[0]
    assert page.locator("#conversation-list").inner_text().count("New conversation") == 1
    assert "Treasure hunt" not in page.locator("#conversation-list").inner_text()
    assert page.goto(conversation_url).status == 404


@web_side_only
def test_model_output_cannot_run_script(browser, daphne_server):
    base = f"http://{daphne_server[0]}"
    page = signed_up_in_a_new_conversation(browser, base, unique_name("mallory"))
    hostile = 'x <img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> **bold** `code`\n```\n<b>x</b>\n```'
    rendered = page.evaluate("""text => {
        const target = document.createElement("div");
        renderMarkdown(target, text);
        document.body.appendChild(target);
        return {html: target.innerHTML, pwned: window.pwned || 0};
    }""", hostile)
    assert rendered["pwned"] == 0 and "<img" not in rendered["html"] and "<script" not in rendered["html"]
    assert "<strong>bold</strong>" in rendered["html"] and "<code>code</code>" in rendered["html"]
    assert "&lt;b&gt;x&lt;/b&gt;" in rendered["html"]


def test_a_second_tab_is_told_the_conversation_is_busy_and_keeps_its_text(browser, daphne_server):
    """Two tabs of one user on one conversation: while the first streams, the second's message is
    refused (one reply at a time) and comes back to its input box instead of hanging on the page."""
    base = f"http://{daphne_server[0]}"
    first = signed_up_in_a_new_conversation(browser, base, unique_name("tabby"))
    second = first.context.new_page()
    second.goto(first.url)
    first.click("details summary")
    first.fill("#max_tokens", "")
    first.fill("#temperature", "0")
    first.fill("#input", "Tell me about lists")  # greedy, to the model's length (as in the test above)
    first.click("#send")
    first.locator("article.assistant[data-streaming]").wait_for()
    second.wait_for_function("document.querySelector('#send') && !document.querySelector('#send').disabled")
    second.fill("#input", "Me too")
    second.click("#send")
    second.wait_for_function("document.querySelector('#status').textContent.includes('another tab')")
    assert second.locator("article.user").count() == 0 and second.input_value("#input") == "Me too"
    first.evaluate("document.getElementById('stop-button').click()")  # a no-op if it has just finished
    first.locator("article.assistant .meta").wait_for()
    second.click("#send")  # now it is answered
    second.locator("article.assistant .meta").wait_for()
    assert second.locator("article.user .content").inner_text() == "Me too"


def test_a_fast_reply_is_rendered_once_per_painted_frame_not_once_per_delta(browser, daphne_server):
    """Re-rendering the whole reply's markdown per token costs the page the square of the reply's
    length; the reply is rendered at most once per frame the browser paints, and whole at the end.
    The page's frames are held back here (its requestAnimationFrame queues them) so the count is exact."""
    page = signed_up_in_a_new_conversation(browser, f"http://{daphne_server[0]}", unique_name("carol"))
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.evaluate("""() => {
        window.counts = {replyRenders: 0, deltas: 0};
        window.heldFrames = [];
        window.realRequestAnimationFrame = window.requestAnimationFrame;
        window.requestAnimationFrame = (callback) => window.heldFrames.push(callback);
        const render = window.renderMarkdown;
        window.renderMarkdown = (target, text) => {
            if (target.isConnected && target.closest("article.assistant")) window.counts.replyRenders++;
            return render(target, text);
        };
        socket.addEventListener("message", (event) => {
            if (JSON.parse(event.data).type === "delta") window.counts.deltas++;
        });
    }""")
    page.click("details summary")
    page.fill("#max_tokens", "")  # to the model's length: still streaming while the frames are held
    page.fill("#temperature", "0")
    page.fill("#input", "Tell me about lists")
    page.click("#send")
    page.wait_for_function("window.counts.deltas >= 20")
    held = page.evaluate("({counts: window.counts, frames: window.heldFrames.length})")
    assert held["counts"]["replyRenders"] == 0 and held["frames"] == 1, held
    # One frame paints: one render, of every token so far.
    rendered = page.evaluate("""() => {
        window.heldFrames.splice(0).forEach((callback) => callback(performance.now()));
        return {renders: window.counts.replyRenders,
                text: document.querySelector("article.assistant .content").textContent};
    }""")
    assert rendered["renders"] == 1 and rendered["text"], rendered
    page.evaluate("() => { window.requestAnimationFrame = window.realRequestAnimationFrame; }")
    page.locator("article.assistant .meta").wait_for()
    stored = page.locator("article.assistant .content").inner_text()
    assert len(stored) > len(rendered["text"])
    page.reload()
    assert page.locator("article.assistant .content").inner_text() == stored, "the whole reply was rendered at the end"


@web_side_only
def test_the_composer_keys_and_a_refused_send_keeping_its_text(browser, daphne_server):
    """Enter sends, Shift+Enter is a newline, an IME's Enter and Enter during a reply send nothing, Esc
    stops a streaming reply as the Stop button does, and a send while the socket is closed leaves the
    text in the input (it used to be cleared before the socket was checked)."""
    page = signed_up_in_a_new_conversation(browser, f"http://{daphne_server[0]}", unique_name("keys"))
    assert page.get_by_label("Message", exact=True).evaluate("el => el.id") == "input"
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.click("details summary")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "8")
    users = page.locator("article.user")

    page.type("#input", "first line")
    page.press("#input", "Shift+Enter")
    page.type("#input", "second line")
    assert users.count() == 0 and page.input_value("#input") == "first line\nsecond line"
    page.press("#input", "Enter")
    page.locator("article.assistant .meta").wait_for()
    assert page.input_value("#input") == "" and users.count() == 1

    page.fill("#input", "composing")
    page.evaluate("""() => document.getElementById("input").dispatchEvent(new KeyboardEvent(
        "keydown", {key: "Enter", isComposing: true, bubbles: true, cancelable: true}))""")
    assert users.count() == 1 and page.input_value("#input") == "composing"

    page.fill("#max_tokens", "")
    page.fill("#input", "Tell me about lists")  # greedy, to the model's length (as in the Stop button test)
    page.press("#input", "Enter")
    page.wait_for_function("document.querySelector('article.assistant[data-streaming] .content')?.textContent.length > 0")
    page.fill("#input", "not while busy")
    page.press("#input", "Enter")
    assert users.count() == 2 and page.input_value("#input") == "not while busy"
    page.press("#input", "Escape")
    meta = page.locator("article.assistant").nth(1).locator(".meta")
    meta.wait_for()
    assert "canceled" in meta.inner_text()

    page.reload()
    assert users.first.locator(".content").inner_text() == "first line\nsecond line"

    # A dropped socket: the page reconnects by itself (test_chat_reconnect.py); meanwhile Send is
    # disabled and an Enter sends nothing and keeps the text, which is still there once it is back.
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.evaluate("retries = 3; socket.close()")  # its first retry 4 s later: time to type and press Enter
    page.wait_for_function("""document.getElementById('status').textContent === 'Reconnecting…'
                              && document.getElementById('send').disabled""")
    page.fill("#input", "typed while offline")
    page.press("#input", "Enter")
    assert users.count() == 2 and page.input_value("#input") == "typed while offline"
    page.wait_for_function("""socket.readyState === WebSocket.OPEN && !document.getElementById('send').disabled
                              && document.getElementById('status').textContent === ''""")
    assert users.count() == 2 and page.input_value("#input") == "typed while offline"

    page.keyboard.press("Tab")  # from the input: the sampling summary, then the Send button
    page.keyboard.press("Tab")
    focused = page.evaluate("""() => ({id: document.activeElement.id,
        visible: document.activeElement.matches(":focus-visible"),
        outline: getComputedStyle(document.activeElement).outlineStyle})""")
    assert focused == {"id": "send", "visible": True, "outline": "solid"}, focused
