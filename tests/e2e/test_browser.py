"""A real headless Chromium (Debian's, driven by Playwright) against a real Daphne: sign up, chat,
watch tokens stream, stop, reload; a second user can open the first user's conversation neither by
URL nor over the socket; the composer's keys."""

from __future__ import annotations


from tests.e2e.conftest import new_page, sign_up, signed_up_in_a_new_conversation


def test_sign_up_chat_stream_stop_reload_and_privacy(browser, daphne_server):
    base = f"http://{daphne_server[0]}"
    alice = signed_up_in_a_new_conversation(browser, base, "alice")
    conversation_url = alice.url

    alice.click("details summary")  # the sampling controls
    alice.fill("#max_tokens", "400")
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
    sign_up(bob, base, "eve")
    assert bob.goto(conversation_url).status == 404
    conversation_id = conversation_url.rsplit("/", 1)[1]
    close_code = bob.evaluate("""id => new Promise(resolve => {
        const ws = new WebSocket(`ws://${location.host}/ws/chat/${id}`);
        ws.onopen = () => resolve("opened");
        ws.onclose = (event) => resolve(event.code);
    })""", conversation_id)
    assert close_code != "opened"


def test_model_output_cannot_run_script(browser, daphne_server):
    base = f"http://{daphne_server[0]}"
    page = signed_up_in_a_new_conversation(browser, base, "mallory")
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
    first = signed_up_in_a_new_conversation(browser, base, "tabby")
    second = first.context.new_page()
    second.goto(first.url)
    first.click("details summary")
    first.fill("#max_tokens", "400")
    first.fill("#temperature", "0")
    first.fill("#input", "Tell me about lists")  # greedy, this runs long (as in the test above)
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
    page = signed_up_in_a_new_conversation(browser, f"http://{daphne_server[0]}", "carol")
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
    page.fill("#max_tokens", "400")
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


def test_the_composer_keys_and_a_refused_send_keeping_its_text(browser, daphne_server):
    """Enter sends, Shift+Enter is a newline, an IME's Enter and Enter during a reply send nothing, Esc
    stops a streaming reply as the Stop button does, and a send while the socket is closed leaves the
    text in the input (it used to be cleared before the socket was checked)."""
    page = signed_up_in_a_new_conversation(browser, f"http://{daphne_server[0]}", "keys")
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

    page.fill("#max_tokens", "400")
    page.fill("#input", "Tell me about lists")  # greedy, this runs long (as in the Stop button test)
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

    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    page.evaluate("socket.close()")
    page.wait_for_function("socket.readyState === 3 && !document.getElementById('send').disabled")
    page.fill("#input", "typed while offline")
    page.click("#send")
    assert page.locator("#status").inner_text() == "Not connected."
    page.press("#input", "Enter")
    assert users.count() == 2 and page.input_value("#input") == "typed while offline"

    page.keyboard.press("Tab")  # from the input: the sampling summary, then the Send button
    page.keyboard.press("Tab")
    focused = page.evaluate("""() => ({id: document.activeElement.id,
        visible: document.activeElement.matches(":focus-visible"),
        outline: getComputedStyle(document.activeElement).outlineStyle})""")
    assert focused == {"id": "send", "visible": True, "outline": "solid"}, focused
