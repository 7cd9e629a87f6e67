"""Hostile and clumsy input against a real Daphne, through each transport: text UTF-8 cannot carry,
wrong types, oversized bodies, undecodable headers, and a cancel that loses its race. Each gets a clear
error, and the socket, the engine and every other request go on (the reason for a real server: the
crashes these found happened in Daphne's encoding of a reply, which no in-process test sees)."""

from __future__ import annotations

import asyncio
from http.client import HTTPConnection
import json
import socket
import threading

import pytest
import websockets

from engine import Engine, EngineConfig, SamplingParams
from tests.reference import greedy_solo as solo
from workbench.serving.engine_host import EngineHost

GREEDY = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}


async def open_socket(address: str, token: str):
    return await websockets.connect(f"ws://{address}/ws/v1/generate",
                                    additional_headers={"Authorization": f"Bearer {token}"})


async def next_frame(ws, awaited: str, seen: list[dict], stall_s: float = 30) -> dict:
    """The socket's next frame; a silence of `stall_s` fails the test naming what it awaited and the
    frames `seen` before, to tell a stuck engine from a slow one."""
    try:
        return json.loads(await asyncio.wait_for(ws.recv(), stall_s))
    except TimeoutError:
        pytest.fail(f"no frame for {stall_s} s awaiting {awaited}; frames so far: "
                    f"{[(f.get('request_id'), f['type']) for f in seen]}")


async def until_done(ws, request_id: str, seen: list[dict] | None = None, stall_s: float = 30) -> list[dict]:
    """Every frame up to and including `request_id`'s done or error (`seen`: the frames read before)."""
    got: list[dict] = []
    while not got or got[-1].get("request_id") != request_id or got[-1]["type"] not in ("done", "error"):
        got.append(await next_frame(ws, f"{request_id!r}'s end", (seen or []) + got, stall_s))
    return got


def http(address: str, method: str, path: str, body: bytes | None = None, **headers: str | bytes):
    """(status, parsed JSON body) of one request; header values may be bytes, sent as they are."""
    host, port = address.split(":")
    conn = HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest(method, path)
        for name, value in {**headers, "Content-Length": str(len(body or b""))}.items():
            conn.putheader(name.replace("_", "-"), value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def handshake_status(address: str, path: str, extra_headers: bytes) -> bytes:
    """The HTTP status of a websocket handshake sent byte for byte (headers no client library sends)."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n".encode()
                     + extra_headers + b"\r\n")
        return conn.recv(4096).split(b"\r\n")[0].split()[1]


def tokens(frames: list[dict], request_id: str) -> list[int]:
    return [t for f in frames if f["type"] == "delta" and f["request_id"] == request_id for t in f["token_ids"]]


def test_lone_surrogates_get_errors_and_the_socket_and_the_engine_go_on(daphne_server):
    address, token = daphne_server
    hostile = [
        r'{"type": "generate", "request_id": "a", "prompt": "abc\ud800def"}',  # killed the engine thread
        r'{"type": "generate", "request_id": "x\ud800", "prompt": "hi"}',  # echoed: dropped the socket
        r'{"type": "cancel", "request_id": "\udc00"}',
        r'{"type": "generate", "request_id": "c", "messages": [{"role": "user", "content": "hi\ud800"}]}',
    ]

    async def run() -> tuple[list[dict], list[dict]]:
        async with await open_socket(address, token) as ws:
            await ws.send(json.dumps({"type": "generate", "request_id": "running", "prompt": "The list type",
                                      "params": {**GREEDY, "max_tokens": 48}}))
            for text in hostile:
                await ws.send(text)
            await ws.send(json.dumps({"type": "generate", "request_id": "ok", "prompt": "A dictionary is",
                                      "params": GREEDY}))
            frames = await until_done(ws, "ok")
            if not any(f.get("request_id") == "running" and f["type"] == "done" for f in frames):
                frames += await until_done(ws, "running")
        async with await open_socket(address, token) as ws:  # a new socket: the engine still serves
            await ws.send(json.dumps({"type": "generate", "request_id": "after", "prompt": "The list type",
                                      "params": GREEDY}))
            after = await until_done(ws, "after")
        return frames, after

    frames, after = asyncio.run(run())
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == ["invalid_request"] * 4, errors
    assert all("lone surrogate" in e["message"] for e in errors)
    assert tokens(frames, "running") == solo("The list type", 48), "the request already running is untouched"
    assert tokens(frames, "ok") == solo("A dictionary is", 16)
    assert tokens(after, "after") == solo("The list type", 16)


def test_the_http_api_answers_bad_text_and_wrong_types_with_a_json_400(daphne_server):
    address, token = daphne_server
    def post(path: str, raw: bytes) -> tuple[int, dict]:
        return http(address, "POST", f"/v1/{path}", raw, Authorization=f"Bearer {token}",
                    Content_Type="application/json")

    cases = [
        ("completions", rb'{"prompt": "\ud800", "max_tokens": 4}', None),
        ("completions", rb'{"prompt": "hi", "model": "\ud800", "stream": true, "max_tokens": 4}', None),
        ("chat/completions", rb'{"messages": [{"role": "user", "content": "hi\ud800"}], "max_tokens": 4}', None),
        ("completions", b'{"prompt": "hi", "stream": true, "stream_options": [1]}', "stream_options"),
        ("completions", b'{"prompt": "hi", "stream": true, "stream_options": {"include_usage": "yes"}}',
         "stream_options"),
        ("completions", b'{"prompt": "hi", "stream": "false"}', "stream"),
        ("completions", b'{"prompt": "hi", "n": true}', "n"),
        ("completions", b'{"prompt": "hi", "max_tokens": 1, "max_completion_tokens": 3}', "max_completion_tokens"),
        ("completions", b"[" * 50_000, None),
    ]
    for path, raw, param in cases:
        status, answer = post(path, raw)
        assert status == 400, (raw[:80], status, answer)
        assert answer["error"]["param"] == param and answer["error"]["message"]
    # Past Django's own 2.5 MB limit too: our 413, as JSON.
    status, answer = post("completions", b'{"prompt": "' + b"x" * 3_000_000 + b'"}')
    assert status == 413 and "limited to" in answer["error"]["message"]
    status, answer = post("completions", json.dumps({"prompt": "The list type", **GREEDY}).encode())
    assert status == 200 and answer["usage"]["completion_tokens"] == 16


def test_an_authorization_header_that_is_not_utf8_is_a_token_that_matches_nobody(daphne_server):
    address, _ = daphne_server
    status, answer = http(address, "GET", "/v1/models", Authorization=b"Bearer \xff\xfe")
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    assert handshake_status(address, "/ws/v1/generate", b"Authorization: Bearer \xff\xfe\r\n") == b"403"


def test_a_cancel_that_loses_the_race_never_cancels_the_next_request_with_that_id(daphne_server):
    """The cancel reaches the engine after the request ended: the next request under the same
    request_id must run whole (it was remembered as an early cancel and ended at once)."""
    address, token = daphne_server

    async def run() -> list[dict]:
        seconds = []
        async with await open_socket(address, token) as ws:
            for _ in range(5):
                await ws.send(json.dumps({"type": "generate", "request_id": "r", "prompt": "The list type",
                                          "params": {**GREEDY, "max_tokens": 2}}))
                while True:  # cancel as the first delta arrives: usually after the engine finished it
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if frame["type"] == "delta":
                        await ws.send(json.dumps({"type": "cancel", "request_id": "r"}))
                    if frame["type"] in ("done", "error"):
                        break
                await ws.send(json.dumps({"type": "generate", "request_id": "r", "prompt": "The list type",
                                          "params": {**GREEDY, "max_tokens": 4}}))
                while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "accepted":
                    pass  # an unknown_request_id for the late cancel may come first
                seconds.append((await until_done(ws, "r")))
        return seconds

    for frames in asyncio.run(run()):
        assert frames[-1]["type"] == "done" and frames[-1]["finish_reason"] == "length", frames[-1]
        assert tokens(frames, "r") == solo("The list type", 4)


class Collect:
    def __init__(self) -> None:
        self.events = []
        self.done = threading.Event()

    def push_threadsafe(self, event) -> None:
        self.events.append(event)
        if event.finished:
            self.done.set()


def test_the_engine_thread_outlives_a_request_it_cannot_take():
    """Behind the API's checks: a prompt the tokenizer cannot encode, and any other failure to add a
    request, end that request with an error; the thread (every user's engine) serves on."""
    thread = EngineHost(lambda: Engine(EngineConfig(model="demo")))
    thread.start()
    try:
        surrogate = Collect()
        thread.add("s", "abc\ud800def", SamplingParams(max_tokens=4), surrogate)
        assert surrogate.done.wait(10) and surrogate.events[-1].error_code == "invalid_request"
        assert "lone surrogate" in surrogate.events[-1].error

        real_add = thread.engine.add_request
        thread.engine.add_request = lambda *args: (_ for _ in ()).throw(RuntimeError("unforeseen"))
        broken = Collect()
        thread.add("b", "The list type", SamplingParams(max_tokens=4), broken)
        assert broken.done.wait(10) and broken.events[-1].error_code == "engine_error"
        thread.engine.add_request = real_add

        after = Collect()
        thread.add("after", "The list type", SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), after)
        assert after.done.wait(30), "the thread still serves"
        assert [t for e in after.events for t in e.token_ids] == solo("The list type", 16)
    finally:
        thread.stop()


def test_a_websocket_path_that_matches_nothing_is_refused_not_a_500(daphne_server):
    address, _ = daphne_server
    for path in ("/ws/chat/abc", "/ws/chat/-1", "/ws/nothing-here"):
        assert handshake_status(address, path, f"Origin: http://{address}\r\n".encode()) == b"403", path


def test_a_flag_change_body_nested_too_deeply_is_a_400(client, django_user_model):
    staff = django_user_model.objects.create_user("ops", password="pw-ops-12345", is_staff=True, is_superuser=True)
    client.force_login(staff)
    response = client.post("/ops/flags", data="[" * 100_000, content_type="application/json")
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]
