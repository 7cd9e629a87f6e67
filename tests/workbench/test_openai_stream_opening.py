"""A streamed chat completion opens each choice with its role chunk only once the choice has tokens, as
vLLM does: a client's time to its first chunk is then its time to the first token, not the time the
request took to be accepted. Shown with the in-process engine held inside its first step."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.testing import ApplicationCommunicator

from workbench.asgi import application
from workbench.serving import bridge

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def chat_scope(token: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
            "root_path": "", "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                         (b"authorization", f"Bearer {token}".encode())],
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}


async def test_the_role_chunk_waits_for_the_first_token(api_user):
    engine = bridge.transport().host.engine
    real_step, stepping, release = engine.step, threading.Event(), threading.Event()

    def held_step():
        stepping.set()
        release.wait(30)
        return real_step()

    engine.step = held_step
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                       "temperature": 0, "stream": True}).encode()
    client = ApplicationCommunicator(application, chat_scope(api_user[1]))
    try:
        await client.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await client.receive_output(timeout=20)
        assert start["type"] == "http.response.start" and start["status"] == 200
        assert await asyncio.to_thread(stepping.wait, 20), "liveness: the engine took the request into a step"
        assert await client.receive_nothing(timeout=1), "a chunk went out before the first token"
        release.set()
        first = await client.receive_output(timeout=20)
        chunk = json.loads(first["body"].decode().split("\n\n")[0].removeprefix("data: "))
        assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text, message = first["body"].decode(), first
        while message.get("more_body"):
            message = await client.receive_output(timeout=20)
            text += message.get("body", b"").decode()
        events = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n")[1:] if e.startswith("data: {")]
        assert text.rstrip().endswith("data: [DONE]") and events, text
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events), "liveness: the reply has text"
    finally:
        release.set()
        engine.step = real_step
        await client.wait(timeout=5)
