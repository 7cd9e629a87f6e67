"""HTML and script that users or the model wrote stay inert on the operator's pages, in a real headless
Chromium against the session's shared in-process Daphne: the dashboard (it shows request ids, which API
clients choose, and user names) and the admin's conversation and message pages (they show titles and
message text, the user's and the model's). The chat page itself is covered by test_chat_render.py.

"Inert" is checked three ways: no script ran (a window flag the markup would set stays unset), no
element the markup names exists in the page, and no request went out for the image it names (an
`onerror` handler needs the image's request first)."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import websockets

from tests.conftest import ADMIN_PASSWORD
from tests.e2e.conftest import log_in, new_page
from tests.e2e.stored_replies import store_exchange

MARKUP = ('<img src="/inert-probe.png" onerror="window.pwned = \'img\'">'
          '<script>window.pwned = "script"</script><b id="bold-probe">b</b>')


def watched(page) -> list[str]:
    """The URLs the page requests from now on."""
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    return requests


def assert_inert(page, requests: list[str], where: str) -> None:
    assert page.evaluate("window.pwned") is None, f"markup ran on {where}"
    assert page.locator("#bold-probe").count() == 0, f"markup became elements on {where}"
    assert page.locator('script:has-text("window.pwned")').count() == 0, where
    assert not [url for url in requests if "inert-probe" in url], f"the markup's image was fetched on {where}"


def test_the_admin_shows_stored_markup_as_text(browser, inprocess_daphne, make_user):
    inprocess_daphne.ensure_admin()
    base = f"http://{inprocess_daphne.address}"
    owner = make_user(inprocess_daphne.address, "markup-writer")
    conversation = owner.new_conversation()
    # A question and a reply (as if the model wrote it) holding the markup; the title is the question's start.
    store_exchange(inprocess_daphne.db_path, conversation, MARKUP, "Here: " + MARKUP)
    page = new_page(browser)
    log_in(page, base, "admin", ADMIN_PASSWORD)
    requests = watched(page)
    for path in ("/admin/chat/conversation/", f"/admin/chat/conversation/{conversation}/change/",
                 "/admin/chat/message/", f"/admin/chat/message/?conversation__id__exact={conversation}"):
        page.goto(base + path)
        assert "<img" in page.locator("#content").inner_text() or "&lt;img" in page.content(), \
            f"liveness: {path} shows the stored markup as text"
        assert_inert(page, requests, path)
    message_ids = re.findall(r"/admin/chat/message/(\d+)/change/", page.content())
    assert len(message_ids) == 2, message_ids
    for message_id in message_ids:
        page.goto(f"{base}/admin/chat/message/{message_id}/change/")
        assert MARKUP in page.locator("textarea").first.input_value(), "liveness: the text is there, whole"
        assert_inert(page, requests, f"message {message_id}")


def test_the_dashboard_shows_a_hostile_request_id_as_text(browser, inprocess_daphne):
    """An API client names its request with markup; the dashboard's sequences table shows it as text."""
    inprocess_daphne.ensure_admin()
    address, token = inprocess_daphne.address, inprocess_daphne.token
    base = f"http://{address}"
    page = new_page(browser)
    log_in(page, base, "admin", ADMIN_PASSWORD)
    requests = watched(page)
    page.goto(f"{base}/ops/dashboard")
    page.wait_for_selector('#connection[data-state="live"]')

    # Playwright's sync API belongs to this thread: the API client runs on a thread of its own.
    shown = threading.Event()
    running = threading.Event()
    ended: list[dict] = []

    def client() -> None:
        async def run() -> None:
            async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                          additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                await ws.send(json.dumps({"type": "generate", "request_id": MARKUP, "prompt": "The list type",
                                          "params": {"max_tokens": None, "ignore_eos": True, "seed": 0}}))
                while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "delta":
                    pass
                running.set()
                await asyncio.to_thread(shown.wait, 90)
                await ws.send(json.dumps({"type": "cancel", "request_id": MARKUP}))
                # Read to the request's end: with 16 deltas unread websockets stops reading, so leaving
                # here would wait out its 10 s close timeout for a Close frame it no longer reads.
                while (frame := json.loads(await asyncio.wait_for(ws.recv(), 60)))["type"] == "delta":
                    pass
                ended.append(frame)
        asyncio.run(run())

    thread = threading.Thread(target=client)
    thread.start()
    try:
        assert running.wait(90), "the hostile request never started"
        row = page.locator("#sequences tbody tr").filter(has_text="inert-probe")
        row.first.wait_for(timeout=30_000)
        assert MARKUP in row.first.inner_text(), "liveness: the request id is shown, as text"
        assert_inert(page, requests, "the dashboard")
    finally:
        shown.set()
        thread.join(60)
    assert ended and ended[0].get("finish_reason") == "canceled", ended
