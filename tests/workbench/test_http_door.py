"""The HTTP door (workbench/api/http_door.py, door_request.py): a body over the size limit, or a large one
for a route that reads it on the input thread without a valid token or while its user's share of that
thread is spent, is answered from its headers, as the route answers such a refusal, and never read
into memory, a file or the application.

What shows "never read": each refusal comes while the client has sent only part of its body, or none
of it, and the application is never handed the request. Each case has its control: the same request
within the limit, or from another user, reaches the application whole.

Two layers: Daphne's HTTP channel with the door, driven byte by byte over a fake transport; and a real
Daphne started as deployments start it (workbench/serve.py), over raw sockets.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket

import pytest
from daphne.http_protocol import HTTPFactory
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from tests.workbench.test_frame_door import FakeServer
from tests.workbench.test_strangers import BIG_PROMPT, post
from workbench.api import door_request
from workbench.serving import input_work

LIMIT = 1000  # WORKBENCH_MAX_FRAME_BYTES in the fake-transport cases
FRAME_LIMIT = 256 * 1024  # the default, the real Daphne's


class HttpServer(FakeServer):
    """What Daphne's HTTP request asks of its server; the scopes it was asked to serve kept."""

    request_buffer_size = 8192
    server_name = "test"

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[dict] = []
        self.logged: list[dict] = []  # the access log's lines (Daphne's action logger)

    def log_action(self, protocol: str, action: str, details: dict) -> None:
        self.logged.append({"protocol": protocol, "action": action, **details})

    def create_application(self, protocol: object, scope: dict) -> asyncio.Queue:
        self.scopes.append(scope)
        return self.queue

    def body(self) -> bytes:
        return b"".join(event.get("body", b"") for event in self.events())


@pytest.fixture
def channel(settings):
    """A factory for Daphne's HTTP channels with the door, each over a fake transport and on the test's
    clock: (channel, transport, server, clock)."""
    settings.WORKBENCH_MAX_FRAME_BYTES = LIMIT
    asyncio.set_event_loop(loop := asyncio.new_event_loop())
    clock = Clock()

    def make(transport_class: type[StringTransport] = StringTransport) -> tuple[object, StringTransport, HttpServer, Clock]:
        server = HttpServer()
        factory = HTTPFactory(server)
        factory.timeOut = None  # twisted's idle timeout would be scheduled on the global reactor
        door_request.install(factory)
        protocol = factory.buildProtocol(("127.0.0.1", 1))
        protocol.requestFactory = type("ClockedDoorRequest", (door_request.DoorRequest,), {"clock": clock})
        transport = transport_class()
        protocol.makeConnection(transport)
        return protocol, transport, server, clock

    yield make
    asyncio.set_event_loop(None)
    loop.close()


def head(path: str, length: int | None, *extra: str) -> bytes:
    sized = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: localhost", "Content-Type: application/json", sized, *extra,
                        "", ""]).encode()


def answer(transport: StringTransport) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of what the server wrote."""
    raw_head, _, body = transport.value().partition(b"\r\n\r\n")
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def message_of(shape: str, body: bytes) -> str:
    """The message of an error answer in each API's shape (docs/PROTOCOL.md), or of the pages' text."""
    if shape == "text":
        return body.decode()
    error = json.loads(body)
    if shape == "anthropic":
        assert error["type"] == "error" and error["error"]["type"] == "request_too_large", error
    return error["error"] if shape == "ollama" else error["error"]["message"]


@pytest.mark.parametrize("path, shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
                                         ("/api/chat", "ollama"), ("/login", "text")])
def test_a_body_over_the_limit_is_answered_from_its_headers_and_never_read(channel, path, shape):
    """Its Content-Length over the limit: a 413 in the route's error shape as soon as the headers are in,
    with what came along with them and all that comes later dropped; the application never sees it,
    and the connection closes once the client has had time to finish writing."""
    protocol, transport, server, clock = channel()
    protocol.dataReceived(head(path, LIMIT + 1) + b"{" * 600)
    status, headers, body = answer(transport)
    assert status == 413 and headers["connection"] == "close", transport.value()
    assert int(headers["content-length"]) == len(body)
    assert f"{LIMIT} bytes" in message_of(shape, body), body
    written = transport.value()
    protocol.dataReceived(b"{" * (LIMIT - 600))  # the rest of the body, and then some
    protocol.dataReceived(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    assert transport.value() == written and server.scopes == [], "nothing more of the client's is read"
    assert not transport.disconnecting, "the client may still be writing its body"
    clock.advance(door_request.LINGER_S)
    assert transport.disconnecting

    protocol, transport, server, _ = channel()  # the control: the same request within the limit
    protocol.dataReceived(head(path, LIMIT) + b"{" * LIMIT)
    assert [scope["path"] for scope in server.scopes] == [path] and server.body() == b"{" * LIMIT
    assert transport.value() == b"", "the application answers it"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_a_chunked_body_is_refused_as_it_grows_past_the_limit(channel):
    """A body without a length is counted as it streams in: the chunk that takes it past the limit is
    answered with the 413, and neither it nor anything later is kept, parsed or handed on."""
    protocol, transport, server, _ = channel()
    protocol.dataReceived(head("/v1/completions", None) + chunk(b"a" * 400) + chunk(b"b" * 400))
    assert transport.value() == b"", "within the limit so far: nothing to answer yet"
    protocol.dataReceived(chunk(b"c" * 400))
    status, _, body = answer(transport)
    assert status == 413 and f"{LIMIT} bytes" in json.loads(body)["error"]["message"], body
    written = transport.value()
    # Not parsed either: bytes that are no chunk at all draw no second answer (twisted's 400).
    protocol.dataReceived(chunk(b"d" * 400) + b"no chunk here\r\n" + b"0\r\n\r\n")
    assert transport.value() == written and server.scopes == [], "nothing after the refusal is parsed or handed on"

    # The same when the refused chunk and bytes that are no chunk come in one read: the decoder, which
    # was parsing that read when the door refused, does not go on parsing it.
    protocol, transport, server, _ = channel()
    protocol.dataReceived(head("/v1/completions", None) + chunk(b"a" * 400) + chunk(b"b" * 400))
    protocol.dataReceived(chunk(b"c" * 400) + b"no chunk here\r\n" + b"0\r\n\r\n")
    status, _, _ = answer(transport)
    assert status == 413 and transport.value().count(b"HTTP/1.1 ") == 1, transport.value()
    assert server.scopes == [] and not transport.disconnecting, "the linger is not cut short"

    protocol, transport, server, _ = channel()  # the control: the same chunks, ending within the limit
    protocol.dataReceived(head("/v1/completions", None) + chunk(b"a" * 400) + chunk(b"b" * 400) + b"0\r\n\r\n")
    assert server.body() == b"a" * 400 + b"b" * 400 and transport.value() == b""


def test_a_client_that_waits_for_100_continue_sends_none_of_a_refused_body(channel):
    """`Expect: 100-continue` (curl's way with a large body): a refused one is answered without the 100,
    so the client never sends its body; what it sends anyway (curl stops waiting after a second) is
    dropped until the connection closes after the linger."""
    protocol, transport, server, clock = channel()
    protocol.dataReceived(head("/v1/chat/completions", LIMIT + 1, "Expect: 100-continue"))
    status, _, _ = answer(transport)
    assert status == 413 and b"100 Continue" not in transport.value(), transport.value()
    written = transport.value()
    protocol.dataReceived(b"{" * 600)
    assert transport.value() == written and server.scopes == [] and not transport.disconnecting
    clock.advance(door_request.LINGER_S)
    assert transport.disconnecting

    protocol, transport, server, _ = channel()  # the control: within the limit, the 100 comes
    protocol.dataReceived(head("/v1/chat/completions", 10, "Expect: 100-continue"))
    assert transport.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    protocol.dataReceived(b"{" * 10)
    assert server.body() == b"{" * 10


def settle() -> None:
    """Lets the door's question (an asyncio task on the test's loop) be answered."""
    loop = asyncio.get_event_loop()
    for _ in range(5):
        loop.run_until_complete(asyncio.sleep(0))


def settle_until(done, timeout: float = 10.0) -> None:
    """Runs the test's loop until `done()`: the door's token lookup runs on a thread of its own."""
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while not done() and loop.time() < deadline:
        loop.run_until_complete(asyncio.sleep(0.01))
    assert done(), "the door did not answer"


LARGE = input_work.LARGE_BYTES


@pytest.mark.parametrize("case, path, data, status", [
    ("over the limit, at the headers", "/v1/chat/completions", head("/v1/chat/completions", LIMIT + 1), 413),
    ("over the limit, a chunked body as it grows", "/api/chat", head("/api/chat", None) + chunk(b"a" * (LIMIT + 1)), 413),
    ("no token, asked at the headers", "/tokenize", head("/tokenize", LARGE), 401),
    ("no token, the body whole before the answer", "/v1/messages", head("/v1/messages", LARGE) + b"{" * LARGE, 401),
])
def test_every_refusal_has_its_access_log_line_with_method_path_and_status(channel, settings, case, path, data, status):
    """Daphne's access log gets a line for each refusal, as for a request the application answered: its
    method, path and status, whether the door refused at the headers, in the body, or once the whole
    body had come in while it was asking (when twisted no longer holds the request line)."""
    protocol, transport, server, _ = channel()
    settings.WORKBENCH_MAX_FRAME_BYTES = LIMIT if status == 413 else FRAME_LIMIT
    protocol.dataReceived(data)
    settle()
    assert answer(transport)[0] == status, (case, transport.value()[:300])
    assert server.scopes == [], case
    [line] = server.logged
    assert (line["method"], line["path"], line["status"], line["action"]) == ("POST", path, status, "complete"), line
    assert line["size"] == len(answer(transport)[2]) and line["client"] == "192.168.1.1:54321", line


@pytest.mark.parametrize("path, shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
                                         ("/api/generate", "ollama")])
@pytest.mark.django_db(transaction=True)  # the lookup's thread closes its old connections first, as in a server
def test_a_token_the_database_cannot_look_up_is_a_503_to_come_back_and_the_body_stays_out(
        channel, settings, monkeypatch, caplog, path, shape):
    """The database is down when the door asks about a large body's token (the lookup raises, as Django
    does when its database does not answer): a 503 with Retry-After in the route's shape, the error
    logged, the body not let in unchecked; the connection closes after the linger. A view could not check
    the token either, and the client is told when to come back."""
    from django.db import OperationalError

    from workbench.api import http_door
    from workbench.api.models import ApiToken

    def database_down(token: str) -> None:
        raise OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")

    settings.WORKBENCH_MAX_FRAME_BYTES = FRAME_LIMIT
    monkeypatch.setattr(ApiToken, "user_for", staticmethod(database_down))
    protocol, transport, server, clock = channel()
    protocol.dataReceived(head(path, LARGE, "Authorization: Bearer some-token", "x-api-key: some-token") + b"{" * 600)
    settle_until(transport.value)
    status, headers, body = answer(transport)
    assert status == 503 and int(headers["retry-after"]) == http_door.UNAVAILABLE_RETRY_S, transport.value()
    error = json.loads(body)
    if shape == "openai":
        assert error["error"]["code"] == "unavailable", error
    if shape == "anthropic":
        assert error["error"]["type"] == "overloaded_error", error
    assert "try again" in (error["error"] if shape == "ollama" else error["error"]["message"]), error
    assert "could not check a request's token" in caplog.text and "Connection refused" in caplog.text
    written = transport.value()
    protocol.dataReceived(b"{" * (LARGE - 600))
    assert transport.value() == written and server.scopes == [], "the body is not let in"
    clock.advance(door_request.LINGER_S)
    assert transport.disconnecting


def reply(request) -> None:
    """The application's whole answer to `request`, as Daphne hands it over."""
    request.handle_reply({"type": "http.response.start", "status": 200, "headers": []})
    request.handle_reply({"type": "http.response.body", "body": b"ok"})


class FullBuffer(StringTransport):
    """A transport whose send buffer is full, its client reading none of its answers: as twisted's TCP
    transport does then, each write asks its producer (the HTTP channel) to pause."""

    def write(self, data: bytes) -> None:
        super().write(data)
        if self.producer is not None:
            self.producer.pauseProducing()


@pytest.mark.django_db(transaction=True)  # the door looks the token up on another thread
def test_the_door_letting_a_body_in_leaves_twisteds_backpressure_standing(channel, settings, monkeypatch, api_user):
    """A pipelining client that reads none of its answers: twisted stops reading its socket (the
    transport told it to pause at the `100 Continue` the door writes on letting a large body in). The
    door's own resume must not undo that: the body is read once the client reads its answers."""
    from workbench.serving import input_share

    monkeypatch.setattr(input_share, "SHARES", input_share.InputShares())
    settings.WORKBENCH_MAX_FRAME_BYTES = FRAME_LIMIT
    _, token = api_user
    protocol, transport, server, _ = channel(FullBuffer)
    protocol.dataReceived(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"
                          + head("/tokenize", LARGE, f"Authorization: Bearer {token}", "Expect: 100-continue"))
    reply(protocol._channel.requests[0])  # an answer the client does not read
    assert transport.producerState == "paused", "the door asks about the large body"
    settle_until(lambda: b"100 Continue" in transport.value())
    assert transport.producerState == "paused", "twisted's hold stands: the client reads none of its answers"
    transport.producer.resumeProducing()  # the client reads them
    assert transport.producerState == "producing"
    protocol.dataReceived(b"{" * LARGE)
    assert [scope["path"] for scope in server.scopes] == ["/v1/models", "/tokenize"] and server.body() == b"{" * LARGE


@pytest.mark.django_db(transaction=True)
def test_the_client_reading_its_answers_does_not_open_the_socket_while_the_door_asks(channel, settings, monkeypatch,
                                                                                     api_user):
    """A pipelining client that has not read an earlier answer (the transport's buffer full: twisted was
    told to pause) catches up while the door asks about a later large body: the transport tells twisted
    to resume, and twisted must not read that body before the door lets it in."""
    from workbench.serving import input_share

    monkeypatch.setattr(input_share, "SHARES", input_share.InputShares())
    settings.WORKBENCH_MAX_FRAME_BYTES = FRAME_LIMIT
    _, token = api_user
    protocol, transport, server, _ = channel()
    protocol.dataReceived(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"
                          + head("/tokenize", LARGE, f"Authorization: Bearer {token}"))
    transport.producer.pauseProducing()  # the first answer fills the transport's buffer
    reply(protocol._channel.requests[0])
    assert transport.producerState == "paused", "the door asks about the large body"
    transport.producer.resumeProducing()  # the client reads the first answer
    assert transport.producerState == "paused", "the door still asks: the body is not read yet"
    settle_until(lambda: transport.producerState == "producing")
    protocol.dataReceived(b"{" * LARGE)
    assert [scope["path"] for scope in server.scopes] == ["/v1/models", "/tokenize"] and server.body() == b"{" * LARGE


SECURITY_HEADERS = {"content-security-policy", "x-content-type-options", "referrer-policy", "x-frame-options",
                    "cross-origin-opener-policy", "strict-transport-security"}


@pytest.mark.django_db(transaction=True)  # the view looks its token up on another thread
def test_a_refusal_of_the_door_carries_the_headers_of_a_views_refusal(channel, settings, api_user):
    """The door's 413 passes Django's middleware as the view's own 413 for the same body does: the same
    headers, the security ones among them, from the same settings (HSTS turned on here, for a request
    its proxy took over TLS, reaches both)."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    _, token = api_user
    protocol, transport, server, _ = channel()
    protocol.dataReceived(head("/v1/chat/completions", LIMIT + 1, f"Authorization: Bearer {token}",
                               "X-Forwarded-Proto: https"))
    status, door_headers, door_body = answer(transport)
    view = async_to_sync(AsyncClient().post)("/v1/chat/completions", data=b"{" * (LIMIT + 1), content_type="application/json",
                                             headers={"Authorization": f"Bearer {token}", "X-Forwarded-Proto": "https"})
    view_headers = {name.lower(): value for name, value in view.headers.items()}
    assert (status, door_body) == (view.status_code, view.content) == (413, door_body), "the same refusal"
    assert SECURITY_HEADERS <= view_headers.keys(), f"liveness: the view's answer has them ({view_headers})"
    assert {name: value for name, value in door_headers.items() if name != "connection"} == view_headers


def raw_request(address: str, request: bytes) -> socket.socket:
    host, port = address.split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    conn.sendall(request)
    return conn


def read_answer(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole answer (its Content-Length read) off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536) or _closed(data)
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        body += conn.recv(65536) or _closed(data + body)
    return int(status_line.split()[1]), headers, body


def _closed(data: bytes) -> bytes:
    raise AssertionError(f"the server closed the connection after {data[:300]!r}")


def api_head(address: str, path: str, length: int, *auth: str) -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", f"Host: {address}", "Content-Type: application/json",
                        f"Content-Length: {length}", *auth, "", ""]).encode()


@pytest.mark.slow  # the session's limited Daphne (tests/workbench/conftest.py)
def test_through_daphne_a_huge_body_is_answered_before_the_client_has_sent_it(limited_daphne):
    """A client declares 10 MB and sends 64 KB of it: Daphne answers the 413, in each API's shape,
    while the client is still sending. Without the door Daphne reads all 10 MB into a file first, and
    this client, which sends no more, would wait for an answer that never comes."""
    address, tokens = limited_daphne
    token = tokens["http-door-bystander"]
    for path, auth, error_of in (("/v1/chat/completions", f"Authorization: Bearer {token}", lambda b: b["error"]["message"]),
                                 ("/v1/messages", f"x-api-key: {token}", lambda b: b["error"]["message"]),
                                 ("/api/generate", f"Authorization: Bearer {token}", lambda b: b["error"])):
        with raw_request(address, api_head(address, path, 10_000_000, auth) + b"{" * 65536) as conn:
            status, headers, body = read_answer(conn)
        assert status == 413 and str(FRAME_LIMIT) in error_of(json.loads(body)), (path, body)
    with raw_request(address, api_head(address, "/tokenize", 2, f"Authorization: Bearer {token}") + b"{x") as conn:
        status, view_headers, body = read_answer(conn)
    assert status == 400 and "not valid JSON" in json.loads(body)["error"]["message"], \
        f"the control: a body within the limit is read and answered by the view ({body!r})"
    security = SECURITY_HEADERS - {"strict-transport-security"}  # off on this Daphne, as by default
    assert {name: headers[name] for name in security} == {name: view_headers[name] for name in security}, \
        "the door's answer has the security headers of the view's"


@pytest.mark.slow
def test_through_daphne_a_spent_share_refuses_a_large_body_unread_while_another_user_is_served(limited_daphne):
    """After one large request spends a user's share of the input thread (a thousandth of it on the
    limited Daphne), their next large body is refused 429 from its headers alone: the client sends none
    of it. The same headers from another user, or without a token (401), are answered as they should:
    the other user's body is waited for (or, asked for, `100 Continue` sent), read and served."""
    address, tokens = limited_daphne
    spender, bystander = tokens["http-door"], tokens["http-door-bystander"]
    large = json.dumps({"prompt": BIG_PROMPT}).encode()
    assert len(large) >= input_work.LARGE_BYTES
    first, _ = post(address, "/tokenize", {"prompt": BIG_PROMPT}, spender)
    assert first == 200, "liveness: a large request within the share is read"

    with raw_request(address, api_head(address, "/tokenize", len(large), f"Authorization: Bearer {spender}")) as conn:
        status, headers, body = read_answer(conn)
    assert status == 429 and json.loads(body)["error"]["code"] == "rate_limited", body
    assert "WORKBENCH_USER_INPUT_SHARE" in json.loads(body)["error"]["message"] and int(headers["retry-after"]) >= 1

    with raw_request(address, api_head(address, "/tokenize", len(large))) as conn:
        status, _, body = read_answer(conn)
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", body

    with raw_request(address, api_head(address, "/tokenize", len(large), f"Authorization: Bearer {bystander}")) as conn:
        conn.settimeout(1.0)
        with pytest.raises(TimeoutError):
            conn.recv(1)  # let in: the server waits for the body
        conn.settimeout(30)
        conn.sendall(large)
        status, _, body = read_answer(conn)
    assert status == 200 and json.loads(body)["count"] > 10_000, "another user's share is their own"

    # A client that waits for `100 Continue` (curl's way with a large body) is told to go on once let in.
    # Another user again: on the limited Daphne one large request spends anyone's share.
    expecting = api_head(address, "/tokenize", len(large), f"Authorization: Bearer {tokens['http-door-expects']}",
                         "Expect: 100-continue")
    with raw_request(address, expecting) as conn:
        assert conn.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.sendall(large)
        status, _, body = read_answer(conn)
    assert status == 200, body


@pytest.mark.django_db(transaction=True)  # the door's lookup runs on another thread, as Channels' do
def test_the_door_takes_the_token_as_each_route_takes_it(django_user_model, settings):
    """Anthropic's routes take `x-api-key` as well as the bearer token; the others only the bearer token
    (an `x-api-key` there is no token: 401, as the view answers it). A revoked token is none either."""
    from workbench.api import http_door, input_routes
    from workbench.api.models import ApiToken

    settings.WORKBENCH_USER_INPUT_SHARE = 0.25
    issued, token = ApiToken.issue(django_user_model.objects.create_user("keyed"), "test")
    messages, chat = input_routes.route_of("/v1/messages"), input_routes.route_of("/v1/chat/completions")
    assert messages is not None and chat is not None

    def asked(route: input_routes.Route, headers: dict[str, str]) -> int | None:
        refusal = asyncio.run(http_door.refusal_of_large(route, headers))
        return None if refusal is None else refusal.status

    assert asked(messages, {"x-api-key": token}) is None, "liveness: Anthropic's key header is a token there"
    assert asked(chat, {"authorization": f"Bearer {token}"}) is None
    assert asked(chat, {"x-api-key": token}) == 401
    assert asked(messages, {}) == 401
    issued.revoke()
    assert asked(messages, {"x-api-key": token}) == 401


def literal_paths(entries, prefix: str = "") -> list[str]:
    """Every path of the URLconf, each converter filled in with a value of its kind. Regex patterns (the
    admin's) are left out: the door guards literal paths only, and refuses to start with a marked view on
    a pattern (input_routes.routes)."""
    from django.urls import URLResolver
    from django.urls.resolvers import RoutePattern

    paths = []
    for entry in entries:
        if not isinstance(entry.pattern, RoutePattern):
            continue
        path = prefix + re.sub(r"<(?:(\w+):)?\w+>", lambda m: "1" if m.group(1) == "int" else "x", str(entry.pattern))
        paths += literal_paths(entry.url_patterns, path) if isinstance(entry, URLResolver) else ["/" + path]
    return paths


# A large body of each shape the API routes read (a chat's messages, Ollama's chat without max_tokens,
# a prompt, a Responses input), so that each route's own checks before its input work pass.
LARGE_BODIES = [{"messages": [{"role": "user", "content": BIG_PROMPT}], "max_tokens": 1},
                {"messages": [{"role": "user", "content": BIG_PROMPT}]}, {"prompt": BIG_PROMPT}, {"input": BIG_PROMPT}]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_door_guards_exactly_the_paths_whose_views_read_on_the_input_thread(django_user_model, monkeypatch):
    """Every path of the URLconf is sent large bodies by a user whose share of the input thread is spent:
    a view that answers `rate_limited` naming WORKBENCH_USER_INPUT_SHARE reads its body on that thread,
    and its path must be one the door guards; and every path the door guards is answered so. A new
    route to an unmarked view that reads on the thread fails here."""
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient
    from django.urls import get_resolver

    from workbench.api import input_routes
    from workbench.api.models import ApiToken
    from workbench.serving import input_share

    monkeypatch.setattr(input_share, "SHARES", input_share.InputShares())
    user = await sync_to_async(django_user_model.objects.create_user)("door-routes")
    _, token = await sync_to_async(ApiToken.issue)(user, "test")
    input_share.SHARES.spent("door-routes", 100.0)
    client, keys = AsyncClient(), {"Authorization": f"Bearer {token}", "x-api-key": token}

    async def reads_on_the_input_thread(path: str) -> bool:
        for body in LARGE_BODIES:
            response = await client.post(path, data=json.dumps(body), content_type="application/json", headers=keys)
            if response.status_code == 429 and b"WORKBENCH_USER_INPUT_SHARE" in response.content:
                return True
        return False

    paths = literal_paths(get_resolver().url_patterns)
    assert "/v1/chat/completions" in paths and any(path.startswith("/admin/") for path in paths)
    reading = {path for path in paths if await reads_on_the_input_thread(path)}
    assert reading == set(input_routes.routes()), "the door's paths are the input thread's readers"
    assert len(reading) == 9, "liveness: every API's reader is found by its answer"


def test_a_new_path_to_an_input_thread_view_is_guarded_and_a_pattern_refused(settings):
    """The door's paths come from the URLconf: one more path to the chat view is guarded as it is. A marked
    view behind a converter is refused at the first question, not left unguarded: the door matches a
    path's end before Django resolves it."""
    from django.core.exceptions import ImproperlyConfigured
    from django.urls import path

    from workbench import urls
    from workbench.api import input_routes
    from workbench.api.openai import views as openai_views

    assert input_routes.route_of("/v2/chat") is None, "the control: not a path of the workbench's URLconf"

    class Rerouted:
        urlpatterns = [*urls.urlpatterns, path("v2/chat", openai_views.chat_completions)]

    settings.ROOT_URLCONF = Rerouted
    assert input_routes.route_of("/v2/chat") == input_routes.Route("openai")
    assert input_routes.route_of("/v1/messages") == input_routes.Route("anthropic", api_key_header=True)

    class Patterned:
        urlpatterns = [path("v2/<str:model>/chat", openai_views.chat_completions)]

    settings.ROOT_URLCONF = Patterned
    with pytest.raises(ImproperlyConfigured, match="literal paths"):
        input_routes.routes()
