"""A deployment strangers can reach: the hostile battery, through the session's shared in-process Daphne
(real HTTP and websocket clients), one case per way in that a stranger, or a user's stolen credential,
could use against it. Each case has its liveness control: the same way in, used as intended, works.

docs/PROTOCOL.md and docs/OPERATIONS.md ("A deployment strangers can reach") say what each refusal is.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import websockets

from tests.cluster import ROOT, free_port
from tests.workbench.test_hostile_input import handshake_status, http, open_socket, until_done
from tests.users import unique_name
from tests.workbench.daphne_session import PASSWORD, Session
from tests.workbench.test_socket_access import Frames, change_user, chat_socket, seen_by_the_server

pytestmark = pytest.mark.slow  # the shared Daphne's start, when this module runs first
# The demo model's vocabulary is 4096 ids (0 to 4095).
PAST_THE_VOCABULARY = 4_000_000_000
LAST_ID = 4095
BIG_PROMPT = "The list type is a mutable sequence of items. " * 5400  # about 250 KB


def post(address: str, path: str, body: dict, token: str) -> tuple[int, dict]:
    return http(address, "POST", path, json.dumps(body).encode(), Content_Type="application/json",
                Authorization=f"Bearer {token}")


def test_token_ids_past_the_vocabulary_are_refused_at_the_door_on_every_route(inprocess_daphne, make_user):
    """With min_tokens the sampler masks the stop tokens, indexing the logits with them: an id past the
    vocabulary would fail the forward (on CUDA, a device-side assert). Every way in refuses it before the
    engine, naming the field; an id at the vocabulary's end is served on each."""
    address, token = inprocess_daphne.address, inprocess_daphne.token
    sampled = {"max_tokens": 4, "min_tokens": 2, "seed": 5}
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        status, answer = post(address, path, {**body, **sampled, "stop_token_ids": [PAST_THE_VOCABULARY]}, token)
        assert status == 400, (path, status, answer)
        assert answer["error"]["code"] == "invalid_params" and answer["error"]["param"] == "stop_token_ids", answer
        assert str(PAST_THE_VOCABULARY) in answer["error"]["message"], answer
        status, answer = post(address, path, {**body, **sampled, "stop_token_ids": [LAST_ID]}, token)
        assert status == 200 and answer["usage"]["completion_tokens"] >= 2, (path, status, answer)
    status, answer = post(address, "/v1/completions", {"prompt": [1, 4096], **sampled}, token)
    assert status == 400 and answer["error"]["param"] == "prompt", answer
    assert answer["error"]["code"] == "invalid_request" and "4096" in answer["error"]["message"], answer

    async def websocket_api() -> list[dict]:
        async with await open_socket(address, token) as ws:
            ended = []
            for request_id, prompt, stop in (("oov-stop", "Hi", PAST_THE_VOCABULARY), ("oov-prompt", [1, 4096], LAST_ID),
                                             ("fits", [1, LAST_ID], LAST_ID)):
                await ws.send(json.dumps({"type": "generate", "request_id": request_id, "prompt": prompt,
                                          "params": {**sampled, "stop_token_ids": [stop]}}))
                ended.append(await until_done(ws, request_id))
            return ended

    # Refused at the door: an error and nothing before it (the engine's refusal would follow `accepted`).
    [stop_refused], [prompt_refused], served_frames = asyncio.run(websocket_api())
    served = served_frames[-1]
    assert stop_refused["type"] == "error" and stop_refused["code"] == "invalid_params", stop_refused
    assert stop_refused["message"].startswith("stop_token_ids:"), stop_refused
    assert prompt_refused["type"] == "error" and prompt_refused["code"] == "invalid_request", prompt_refused
    assert "4096" in prompt_refused["message"], prompt_refused
    assert served["type"] == "done", served

    user = make_user(address, "oov-chat")
    conversation = user.new_conversation()

    async def chat() -> tuple[dict, dict]:
        async with chat_socket(user, conversation) as ws:
            frames = Frames(ws)
            await frames.send({"type": "send", "content": "Hi",
                               "params": {**sampled, "stop_token_ids": [PAST_THE_VOCABULARY]}})
            refused = await frames.until(lambda f: f["type"] in ("error", "done"))
            await frames.send({"type": "send", "content": "Hi", "params": {**sampled, "stop_token_ids": [LAST_ID]}})
            return refused, await frames.until(lambda f: f["type"] in ("error", "done"))

    refused, answered = asyncio.run(chat())
    assert refused["type"] == "error" and refused["code"] == "invalid_params", refused
    assert refused["message"].startswith("stop_token_ids:"), refused
    assert answered["type"] == "done" and answered["finish_reason"] in ("length", "stop"), answered


def test_an_integer_of_five_thousand_digits_is_a_clear_refusal_on_http_and_on_sockets(inprocess_daphne):
    """Python's int() refuses more than 4300 digits with a ValueError, which is no JSONDecodeError: the
    answer is a 400 and an `error` frame that say what is wrong, never a 500 or internal_error; the socket
    goes on (its next request is served)."""
    address, token = inprocess_daphne.address, inprocess_daphne.token
    huge = "1" * 5000
    raw = f'{{"prompt": "Hi", "max_tokens": {huge}, "seed": 1}}'.encode()
    status, answer = http(address, "POST", "/v1/completions", raw, Content_Type="application/json",
                          Authorization=f"Bearer {token}")
    assert status == 400 and "4300 digits" in answer["error"]["message"], (status, answer)

    async def socket() -> tuple[dict, list[dict]]:
        async with await open_socket(address, token) as ws:
            await ws.send(f'{{"type": "generate", "request_id": "huge", "prompt": "Hi", "params": {{"seed": {huge}}}}}')
            refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
            await ws.send(json.dumps({"type": "generate", "request_id": "after", "prompt": "Hi",
                                      "params": {"max_tokens": 2, "seed": 1}}))
            return refused, await until_done(ws, "after")

    refused, after = asyncio.run(socket())
    assert refused["type"] == "error" and refused["code"] == "invalid_json", refused
    assert "4300 digits" in refused["message"], refused
    assert after[-1]["type"] == "done", after


def test_a_request_id_with_a_line_break_is_refused_before_it_reaches_a_log(inprocess_daphne):
    """The request_id becomes part of the engine's request id, which Celery workers log ("admitted ...");
    a newline in it would let a client forge log lines. Only printable ids are taken; one with a space
    (printable) is served."""
    address, token = inprocess_daphne.address, inprocess_daphne.token

    async def run() -> list[list[dict]]:
        async with await open_socket(address, token) as ws:
            ended = []
            for request_id in ("r1\nINFO admitted forged", "r2\u202e", "r3 with spaces"):
                await ws.send(json.dumps({"type": "generate", "request_id": request_id, "prompt": "Hi",
                                          "params": {"max_tokens": 2, "seed": 1}}))
                ended.append(await until_done(ws, request_id))
            return ended

    newline, override, spaced = asyncio.run(run())
    for refused in (newline, override):
        assert [f["type"] for f in refused] == ["error"] and refused[0]["code"] == "invalid_request", refused
        assert "printable" in refused[0]["message"], refused
    assert [f["type"] for f in spaced][0] == "accepted" and spaced[-1]["type"] == "done", spaced


def test_an_api_token_does_not_open_the_chat_socket(inprocess_daphne, make_user):
    """An API token is for the APIs: on the chat socket it would read its owner's conversations (resume)
    and add turns to them. Refused at the handshake, even the owner's own token beside the owner's
    session; the session alone opens it."""
    address = inprocess_daphne.address
    owner = make_user(address, "token-chat")
    conversation = owner.new_conversation()
    _, token = owner.new_token("laptop")
    origin = f"Origin: http://{address}\r\n"
    path = f"/ws/chat/{conversation}"
    assert handshake_status(address, path, f"Authorization: Bearer {token}\r\n".encode()) == b"403"
    assert handshake_status(address, path, f"Authorization: Bearer {token}\r\n{origin}".encode()) == b"403"
    both = f"Authorization: Bearer {token}\r\nCookie: {owner.cookie()}\r\n{origin}"
    assert handshake_status(address, path, both.encode()) == b"403"
    assert handshake_status(address, path, f"Cookie: {owner.cookie()}\r\n{origin}".encode()) == b"101"
    assert handshake_status(address, "/ws/v1/generate", f"Authorization: Bearer {token}\r\n".encode()) == b"101", \
        "liveness: the token opens the API's socket"


def test_a_password_change_closes_the_sessions_open_sockets_at_their_next_frame(inprocess_daphne, make_user):
    """A stolen session must not outlive the password change that answers the theft: Django signs the
    session out at its next page request (its session auth hash no longer matches); an open socket is
    refused at its next frame the same way, `password_changed`, closed as a sign-out (4440). The
    password is changed in the database the server reads, as an admin's save elsewhere changes it: seen at
    the first frame once the socket's kept answer is older than WORKBENCH_SOCKET_RECHECK_S."""
    from django.contrib.auth.hashers import make_password

    address, db_path = inprocess_daphne.address, inprocess_daphne.db_path
    user = make_user(address, "password-changer")
    conversation = user.new_conversation()
    new_hash = make_password("another-pass-42!")

    async def run() -> tuple[dict, list[str], int | None]:
        async with chat_socket(user, conversation) as ws:
            frames = Frames(ws)
            await frames.send({"type": "resume", "from_offset": 0})
            before = await frames.until(lambda f: f["type"] in ("done", "error"))
            with sqlite3.connect(db_path) as db:
                db.execute("UPDATE auth_user SET password = ? WHERE username = ?", (new_hash, user.username))
            db.close()
            await seen_by_the_server()
            await frames.send({"type": "resume", "from_offset": 0})
            close_code = await frames.until_closed()
            return before, frames.errors(), close_code

    before, errors, close_code = asyncio.run(run())
    assert before == {"type": "done", "content": None}, "liveness: the socket answered before the change"
    assert errors == ["password_changed"] and close_code == 4440, (errors, close_code)


def start_debugging_server(tmp_path, bind: str) -> tuple[subprocess.Popen, int, bool]:
    """`python -m workbench.serve -b BIND` with WORKBENCH_DEBUG=1: (the process, its port, whether it
    listens; False: it exited, its stderr saying why)."""
    port = free_port()
    env = {**os.environ, "WORKBENCH_DEBUG": "1", "WORKBENCH_DB_PATH": str(tmp_path / f"{bind}.sqlite3")}
    server = subprocess.Popen([sys.executable, "-m", "workbench.serve", "-b", bind, "-p", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server, port, True
        except OSError:
            time.sleep(0.2)
    return server, port, False


def page_for_host(port: int, host: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/no-such-page", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_debug_is_refused_where_strangers_reach_the_server_whatever_their_host_header(tmp_path):
    """The Host header is the client's to write: a server with WORKBENCH_DEBUG=1 bound to 0.0.0.0 (and
    answering only "localhost") would give anyone who sent `Host: localhost` Django's debug pages. It
    refuses to start, naming the bind; bound to 127.0.0.1 it starts and debugs (the control)."""
    server, port, listening = start_debugging_server(tmp_path, "0.0.0.0")
    try:
        if listening:
            status, page = page_for_host(port, "localhost")
            pytest.fail(f"a debugging server bound to 0.0.0.0 started and answered Host: localhost with {status}"
                        f"{' and a debug page' if 'DEBUG = True' in page else ''}")
        stderr = server.communicate(timeout=30)[1]
    finally:
        server.kill()
        server.wait()
    assert server.returncode != 0, stderr
    assert "WORKBENCH_DEBUG is on while the server listens on tcp:port=" in stderr, stderr[-2000:]

    server, port, listening = start_debugging_server(tmp_path, "127.0.0.1")
    try:
        assert listening, server.communicate(timeout=30)[1][-2000:]
        status, page = page_for_host(port, "localhost")
        assert status == 404 and "DEBUG = True" in page, "liveness: on loopback the debug pages are served"
    finally:
        server.kill()
        server.wait()


@pytest.mark.django_db
def test_with_debug_on_a_client_beyond_loopback_is_refused_whatever_its_host_header(client):
    """For a server started without workbench.serve (plain daphne, runserver 0.0.0.0:8000), whose bind
    nothing checked: with DEBUG on, each request's own address (the connection's) must be loopback."""
    from django.conf import settings
    from django.test import Client, override_settings

    guarded = ["workbench.debug_guard.LoopbackClientsOnly", *settings.MIDDLEWARE]
    with override_settings(DEBUG=True, MIDDLEWARE=guarded):
        stranger = Client(REMOTE_ADDR="203.0.113.7").get("/no-such-page", HTTP_HOST="localhost")
        here = Client().get("/no-such-page", HTTP_HOST="localhost")  # the test client's address is 127.0.0.1
    assert stranger.status_code == 403 and b"DEBUG = True" not in stranger.content
    assert here.status_code == 404 and b"DEBUG = True" in here.content, "liveness: this machine is answered"


@pytest.mark.django_db
def test_the_token_admin_cannot_hand_a_token_to_someone_else_or_bring_a_revoked_one_back(django_user_model):
    """In-process (the admin's forms): staff may rename and revoke tokens, never change whose a token is
    or clear its revocation."""
    from django.test import Client
    from django.utils import timezone

    from workbench.api.models import ApiToken

    staff = django_user_model.objects.create_superuser("token-admin", password="pw-token-admin-1")
    owner = django_user_model.objects.create_user("token-owner", password="pw-token-owner-1")
    thief = django_user_model.objects.create_user("token-thief", password="pw-token-thief-1")
    token, plaintext = ApiToken.issue(owner, "laptop")
    token.revoke()
    revoked_at = ApiToken.objects.get(pk=token.pk).revoked_at
    admin = Client()
    admin.force_login(staff)
    answer = admin.post(f"/admin/api/apitoken/{token.pk}/change/", {
        "name": "renamed", "user": thief.pk, "revoked_at_0": "", "revoked_at_1": "",
        "created_at_0": timezone.now().date().isoformat(), "created_at_1": "00:00:00"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    saved = ApiToken.objects.get(pk=token.pk)
    assert saved.name == "renamed", "liveness: the form saved what it may change"
    assert saved.user == owner and saved.revoked_at == revoked_at
    assert ApiToken.user_for(plaintext) is None
    assert admin.get("/admin/api/apitoken/add/").status_code == 403

    live, _ = ApiToken.issue(owner, "desktop")
    admin.post("/admin/api/apitoken/", {"action": "revoke", "_selected_action": [live.pk]})
    assert ApiToken.objects.get(pk=live.pk).revoked_at is not None, "staff revoke with the list's action"


def form_status(session: Session, path: str, fields: dict[str, str]) -> tuple[int, str, str]:
    """(status, the URL it ended at, the page) of a form of `path` sent with its CSRF token."""
    try:
        answer = session._post(path, fields)
        return answer.status, answer.geturl(), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.geturl(), exc.read().decode()


def user_exists(db_path, username: str) -> bool:
    with sqlite3.connect(db_path) as db:
        found = db.execute("SELECT 1 FROM auth_user WHERE username = ?", (username,)).fetchone() is not None
    db.close()
    return found


def test_a_one_character_password_is_refused_at_sign_up(inprocess_daphne):
    """Django's password validators run on sign-up: the password "a" is refused."""
    address, db_path = inprocess_daphne.address, inprocess_daphne.db_path
    name = unique_name("weak")
    status, _, page = form_status(Session(address), "/signup", {"username": name, "password1": "a", "password2": "a"})
    assert status == 400 and "too short" in page, status
    assert not user_exists(db_path, name)
    Session(address).sign_up(name)  # liveness: the tests' password (tests/workbench/daphne_session.py) passes
    assert user_exists(db_path, name)


def test_twenty_wrong_passwords_and_then_even_the_right_one_is_refused(inprocess_daphne, make_user):
    """Unthrottled, anyone could guess at a password as fast as the server answered.
    Past WORKBENCH_LOGIN_FAILURES_PER_ACCOUNT (10) failures in a window, every sign-in to the account is
    refused (429) until the window ends, the right password too; the admin's login likewise."""
    address, db_path = inprocess_daphne.address, inprocess_daphne.db_path
    user = make_user(address, "guessed")
    Session(address).log_in(user.username, PASSWORD)  # liveness: the right password signs in before
    answers = [form_status(Session(address), "/login", {"username": user.username, "password": f"guess-{n}"})[0]
               for n in range(20)]
    assert answers[:10] == [200] * 10 and set(answers[10:]) == {429}, answers
    status, landed, page = form_status(Session(address), "/login", {"username": user.username, "password": PASSWORD})
    assert status == 429 and "Too many failed sign-ins" in page, (status, landed)

    staff = make_user(address, "guessed-staff")
    change_user(db_path, staff.username, is_staff=1)
    status, landed, _ = form_status(Session(address), "/admin/login/", {"username": staff.username, "password": PASSWORD})
    # (without the page's hidden `next` a signed-in admin login lands on LOGIN_REDIRECT_URL)
    assert status == 200 and "/admin/login/" not in landed, "liveness: the admin's login takes the right password"
    for n in range(10):
        form_status(Session(address), "/admin/login/", {"username": staff.username, "password": f"guess-{n}"})
    status, landed, page = form_status(Session(address), "/admin/login/", {"username": staff.username, "password": PASSWORD})
    assert "/admin/login/" in landed and "Too many failed sign-ins" in page, (status, landed)


def test_one_user_holds_at_most_the_socket_limit(inprocess_daphne, make_user):
    """Every socket is a consumer: one user could open them as fast as the network allowed.
    WORKBENCH_USER_SOCKETS (32) open sockets per user; beyond, a structured refusal. Closing a socket
    makes room."""
    address = inprocess_daphne.address
    _, token = make_user(address, "many-sockets").new_token("script")

    async def sockets() -> tuple[list[dict], int | None, str]:
        held = [await open_socket(address, token) for _ in range(32)]
        try:
            extra = await open_socket(address, token)
            refused = [json.loads(await asyncio.wait_for(extra.recv(), 30))]
            try:
                await asyncio.wait_for(extra.recv(), 30)
            except websockets.ConnectionClosed:
                pass
            await held.pop().close()
            async with await open_socket(address, token) as again:
                await again.send(json.dumps({"type": "cancel", "request_id": "none"}))
                answer = json.loads(await asyncio.wait_for(again.recv(), 30))["code"]
            return refused, extra.close_code, answer
        finally:
            for ws in held:
                await ws.close()

    refused, close_code, answer = asyncio.run(sockets())
    assert [f["code"] for f in refused] == ["too_many_sockets"] and close_code == 4429, (refused, close_code)
    assert answer == "unknown_request_id", "liveness: with one closed, another socket opens and is answered"


def test_one_socket_sends_at_most_its_frame_rate(limited_daphne):
    """Every frame is a database query: a socket may send WORKBENCH_SOCKET_FRAMES_PER_S frames a second,
    in bursts of two seconds' worth (8 and 16 on the limited Daphne); beyond, each frame is refused
    unread with a structured error. A socket that waits is answered again."""
    address, tokens = limited_daphne

    async def flood() -> tuple[list[str], str]:
        async with await open_socket(address, tokens["flooder"]) as ws:
            for _ in range(80):
                await ws.send(json.dumps({"type": "cancel", "request_id": "none"}))
            codes = [json.loads(await asyncio.wait_for(ws.recv(), 30))["code"] for _ in range(80)]
            await asyncio.sleep(2.5)
            await ws.send(json.dumps({"type": "cancel", "request_id": "none"}))
            return codes, json.loads(await asyncio.wait_for(ws.recv(), 30))["code"]

    codes, after = asyncio.run(flood())
    assert set(codes) == {"unknown_request_id", "too_many_frames"}, set(codes)
    # The burst (16) at least; more as the budget refills while the server works through them.
    assert codes.count("unknown_request_id") >= 16, codes.count("unknown_request_id")
    assert after == "unknown_request_id", "liveness: after a pause the socket is answered again"


def test_a_user_gets_a_share_of_the_thread_that_reads_large_requests(limited_daphne):
    """Large requests (250 KB prompts here) are read on one thread that every user shares; a user whose
    reading took more than WORKBENCH_USER_INPUT_SHARE of it over 10 s (a thousandth on the limited
    Daphne: 10 ms, less than one such prompt) is refused more large ones, with 429 rate_limited, before
    their work is done. Small requests, and other users' large ones, go on."""
    address, tokens = limited_daphne
    large = {"prompt": BIG_PROMPT}
    first, _ = post(address, "/tokenize", large, tokens["big-reader"])
    second, refused = post(address, "/tokenize", large, tokens["big-reader"])
    small, _ = post(address, "/tokenize", {"prompt": "Hi"}, tokens["big-reader"])
    other, counted = post(address, "/tokenize", large, tokens["bystander"])
    assert first == 200, "liveness: a large request within the share is read"
    assert second == 429 and refused["error"]["code"] == "rate_limited", refused
    assert "WORKBENCH_USER_INPUT_SHARE" in refused["error"]["message"], refused
    assert small == 200, "a small request is read where it arrives, outside the share"
    assert other == 200 and counted["count"] > 10_000, "another user's share is their own"


def test_tokenize_and_detokenize_are_limited_per_user(limited_daphne):
    """WORKBENCH_USER_TOKENIZE_PER_MINUTE calls a minute per user of /tokenize and /detokenize together
    (6 on the limited Daphne), then 429 rate_limited with Retry-After. The minute opens at the first call,
    so the seventh within it is refused."""
    address, tokens = limited_daphne
    token = tokens["tokenizer"]
    statuses = []
    for n in range(13):
        path, body = ("/tokenize", {"prompt": "Hi"}) if n % 2 else ("/detokenize", {"tokens": [1, 2]})
        status, answer = post(address, path, body, token)
        statuses.append(status)
        if status == 429:
            assert answer["error"]["code"] == "rate_limited", answer
            break
    assert statuses == [200] * 6 + [429], statuses
