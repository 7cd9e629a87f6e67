"""A client that disconnects mid-stream from the OpenAI API aborts its sequence in the engine."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.testing import ApplicationCommunicator

from workbench.asgi import application
from workbench.serving import bridge

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("serving_transport")]


def running_completions() -> set[str]:
    return {rid for rid in bridge.transport().running_request_ids() if rid.startswith("cmpl-")}


async def test_disconnect_mid_stream_aborts_the_sequence(api_user):
    body = json.dumps({"model": "demo", "prompt": "x", "max_tokens": 400, "ignore_eos": True, "temperature": 0,
                       "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"authorization", f"Bearer {api_user[1]}".encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    client = ApplicationCommunicator(application, scope)
    await client.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await client.receive_output(timeout=20)
    assert start["type"] == "http.response.start" and start["status"] == 200
    first = await client.receive_output(timeout=20)
    assert first["type"] == "http.response.body" and first["body"].startswith(b"data: ")
    for _ in range(500):
        if running_completions():
            break
        await asyncio.sleep(0.01)
    assert running_completions(), "liveness: the engine runs the request"
    await client.send_input({"type": "http.disconnect"})
    for _ in range(500):
        if not running_completions():
            break
        await asyncio.sleep(0.01)
    assert not running_completions()
    await client.wait(timeout=5)
