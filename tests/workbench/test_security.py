"""The security sweep through the session's shared in-process Daphne (real HTTP and websocket handshakes,
sent byte for byte where a client library would add or refuse a header): every path refuses the
unauthenticated, every socket refuses a foreign Origin, one user cannot tell another's conversation from
one that does not exist, and a revoked API token loses the socket it had already opened.

The paths' own tests cover the rest (docs/RELIABILITY.md, "Security" lists which test holds what).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import urllib.error
import urllib.request

import pytest
import websockets

from tests.conftest import ADMIN_PASSWORD
from tests.waiting import async_wait_until
from tests.workbench.daphne_session import Session
from tests.workbench.test_hostile_input import handshake_status, http

pytestmark = pytest.mark.slow  # the shared Daphne's start, when this module runs first
FOREIGN = "http://evil.example"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def status_and_location(url: str, cookie: str = "") -> tuple[int, str]:
    """A GET's status and Location, redirects not followed."""
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        response = urllib.request.build_opener(_NoRedirects).open(request, timeout=30)
        return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", "")


def test_every_path_refuses_the_unauthenticated(inprocess_daphne):
    address = inprocess_daphne.address
    base = f"http://{address}"
    for page in ("/", "/c/1", "/tokens", "/ops/dashboard"):
        status, location = status_and_location(base + page)
        assert status == 302 and location.startswith("/login"), (page, status, location)
    status, location = status_and_location(base + "/admin/")
    assert status == 302 and location.startswith("/admin/login/"), (status, location)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Hi"}), ("/tokenize", {"prompt": "Hi"}),
                       ("/detokenize", {"tokens": [1]})):
        status, answer = http(address, "POST", path, json.dumps(body).encode(), Content_Type="application/json")
        assert status == 401 and answer["error"]["code"] == "invalid_api_key", (path, status, answer)
    origin = f"Origin: {base}\r\n".encode()
    for socket_path in ("/ws/v1/generate", "/ws/chat/1", "/ws/ops/dashboard"):
        assert handshake_status(address, socket_path, origin) == b"403", socket_path


def test_every_socket_refuses_a_foreign_origin_even_with_valid_credentials(inprocess_daphne, make_user):
    """A page of another site may open a socket in the browser of a signed-in user (the browser sends
    the user's cookie): the Origin header says whose page it is. Each control opens."""
    address, token = inprocess_daphne.address, inprocess_daphne.token
    base = f"http://{address}"
    inprocess_daphne.ensure_admin()
    user = make_user(address, "origin-user")
    conversation = user.new_conversation()
    admin = Session(address).log_in("admin", ADMIN_PASSWORD)
    cases = [("/ws/v1/generate", f"Authorization: Bearer {token}\r\n"),
             (f"/ws/chat/{conversation}", f"Cookie: {user.cookie()}\r\n"),
             ("/ws/ops/dashboard", f"Cookie: {admin.cookie()}\r\n")]
    for path, credentials in cases:
        assert handshake_status(address, path, f"{credentials}Origin: {base}\r\n".encode()) == b"101", path
        host, port = address.split(":")
        for foreign in (FOREIGN, f"http://{host}.evil.example:{port}", "null"):
            status = handshake_status(address, path, f"{credentials}Origin: {foreign}\r\n".encode())
            # 403 from the origin check; "null" (a sandboxed page) is refused by Daphne itself, 400.
            assert status == (b"400" if foreign == "null" else b"403"), (path, foreign, status)
    # An API client sends no Origin; its token is its credential (workbench/api/origin.py).
    assert handshake_status(address, "/ws/v1/generate", f"Authorization: Bearer {token}\r\n".encode()) == b"101"


def test_another_users_conversation_cannot_be_told_from_one_that_does_not_exist(inprocess_daphne, make_user):
    """Conversation ids are sequential (guessable), so what guards them is that a stranger learns nothing:
    the same 404 page and the same refused handshake as for an id no conversation has."""
    address = inprocess_daphne.address
    base = f"http://{address}"
    owner = make_user(address, "private-owner")
    theirs = owner.new_conversation()
    stranger = make_user(address, "private-stranger")
    missing = theirs + 10_000
    for suffix in ("", "/export.md", "/export.json"):
        found = [urllib.request.build_opener(urllib.request.HTTPCookieProcessor(stranger.jar))
                 for _ in range(2)]
        answers = []
        for opener, conversation in zip(found, (theirs, missing)):
            try:
                opener.open(f"{base}/c/{conversation}{suffix}", timeout=30)
                answers.append((200, ""))
            except urllib.error.HTTPError as exc:
                # The 404 page's logout form carries a CSRF token masked afresh for every response.
                page = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", exc.read().decode())
                answers.append((exc.code, re.sub(r"\d+", "N", page)))
        assert answers[0] == answers[1] and answers[0][0] == 404, (suffix, answers)
    origin = f"Cookie: {stranger.cookie()}\r\nOrigin: {base}\r\n".encode()
    assert handshake_status(address, f"/ws/chat/{theirs}", origin) == handshake_status(
        address, f"/ws/chat/{missing}", origin) == b"403"
    own = f"Cookie: {owner.cookie()}\r\nOrigin: {base}\r\n".encode()
    assert handshake_status(address, f"/ws/chat/{theirs}", own) == b"101", "liveness: the owner's opens"


def running_requests(address: str) -> float:
    scrape = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in scrape.splitlines()
               if line.startswith("workbench_requests_running{"))


def test_a_revoked_token_closes_its_open_socket_at_the_next_frame(inprocess_daphne, make_user):
    """DECISION (docs/PROTOCOL.md): a token is checked again for every frame its socket sends; once it
    is revoked the next frame gets `token_revoked` and the socket closes with 4401, which cancels the
    requests it was running. The same token is refused over HTTP and at the next handshake."""
    address = inprocess_daphne.address
    user = make_user(address, "revoker")
    token_id, token = user.new_token("laptop")

    async def run() -> tuple[list[dict], int | None, list[float]]:
        frames: list[dict] = []
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(json.dumps({"type": "generate", "request_id": "long", "prompt": "The list type",
                                      "params": {"max_tokens": None, "ignore_eos": True, "temperature": 0}}))
            while not any(f["type"] == "delta" for f in frames):
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            # The metrics come from the engine's snapshot at the end of a step, which may follow the
            # step's first delta: polled, not read once.
            running = [await async_wait_until(lambda: running_requests(address), 10, "the request shown running")]
            await asyncio.to_thread(user.revoke_token, token_id)
            await ws.send(json.dumps({"type": "cancel", "request_id": "none-such"}))
            try:
                while True:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            except websockets.ConnectionClosed:
                pass
            for _ in range(100):  # the engine lets the canceled request go at its next step
                running.append(running_requests(address))
                if running[-1] == 0:
                    break
                await asyncio.sleep(0.1)
            return frames, ws.close_code, running

    frames, close_code, running = asyncio.run(run())
    assert running[0] >= 1, "liveness: the long request ran when the token was revoked"
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == ["token_revoked"] and "4401" in errors[0]["message"], errors
    assert not any(f["type"] == "done" for f in frames), "the long request did not run to its end"
    assert close_code == 4401
    assert running[-1] == 0, f"the revoked socket's request still runs in the engine: {running}"
    status, answer = http(address, "POST", "/v1/completions", json.dumps({"prompt": "Hi"}).encode(),
                          Content_Type="application/json", Authorization=f"Bearer {token}")
    assert status == 401, answer
    assert handshake_status(address, "/ws/v1/generate", f"Authorization: Bearer {token}\r\n".encode()) == b"403"


@pytest.mark.django_db
def test_forms_need_the_csrf_token_tokens_are_kept_as_digests_and_the_admin_is_staff_only(django_user_model):
    """In-process (Django's test client): what the shared Daphne would answer the same way."""
    from django.test import Client

    from workbench.api.models import ApiToken

    user = django_user_model.objects.create_user("csrf-user", password="pw-csrf-12345")
    strict = Client(enforce_csrf_checks=True)
    assert strict.post("/login", {"username": "csrf-user", "password": "pw-csrf-12345"}).status_code == 403
    assert strict.post("/signup", {"username": "x", "password1": "a-long-pass-9!",
                                   "password2": "a-long-pass-9!"}).status_code == 403
    strict.force_login(user)
    assert strict.post("/tokens", {"name": "laptop"}).status_code == 403
    token, plaintext = ApiToken.issue(user, "laptop")
    assert strict.post(f"/tokens/{token.pk}/revoke").status_code == 403
    assert ApiToken.user_for(plaintext) == user, "a refused revoke changed nothing"
    assert ApiToken.objects.filter(user=user).count() == 1, "a refused create made nothing"

    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert plaintext not in json.dumps(row, default=str), "the token itself is stored nowhere"
    assert row["digest"] == hashlib.sha256(plaintext.encode()).hexdigest()

    for path in ("/admin/", "/admin/chat/message/", "/admin/api/apitoken/", "/admin/ops/requestcancel/"):
        response = strict.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), path
