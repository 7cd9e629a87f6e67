"""A chat socket killed mid-reply: the page says it is reconnecting, opens a new socket, follows the
reply from the token after its last one, and ends with the reply as stored, every token exactly once."""

from __future__ import annotations

from tests.e2e.conftest import signed_up_in_a_new_conversation
from tests.users import unique_name


def ask(page) -> None:
    page.click("details summary")
    page.fill("#max_tokens", "300")
    page.fill("#temperature", "0")
    page.fill("#input", "Tell me about lists")
    page.click("#send")


def test_a_socket_killed_mid_reply_reconnects_and_the_reply_completes_once(browser, daphne_server):
    base = f"http://{daphne_server[0]}"
    page = signed_up_in_a_new_conversation(browser, base, unique_name("dora"))
    page.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    ask(page)
    page.wait_for_function("reply && reply.nextIndex > 5")
    page.evaluate("""() => {
        window.statuses = [];
        new MutationObserver(() => window.statuses.push(statusLine.textContent))
            .observe(statusLine, {childList: true, characterData: true, subtree: true});
        window.killed = socket;
        socket.close();
    }""")
    page.locator("article.assistant .meta").wait_for()
    assert page.evaluate("socket !== window.killed && socket.readyState === WebSocket.OPEN")
    statuses = page.evaluate("window.statuses")
    assert "Reconnecting…" in statuses, statuses
    assert page.locator("#status").inner_text() == ""
    assert "tokens" in page.locator("article.assistant .meta").inner_text()
    shown = page.locator("article.assistant .content").inner_text()
    page.reload()
    stored = page.locator("article.assistant .content").inner_text()
    # The same reply, greedy, on a socket never dropped: the resumed one has each token exactly once.
    again = signed_up_in_a_new_conversation(browser, base, unique_name("dora"))
    again.wait_for_function("socket && socket.readyState === WebSocket.OPEN")
    ask(again)
    again.locator("article.assistant .meta").wait_for()
    greedy = again.locator("article.assistant .content").inner_text()
    assert shown == stored == greedy
