"""End to end against a real Daphne: real websocket clients and the official openai package."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request

import openai
import pytest
import websockets

from tests.cluster import ROOT

MESSAGES = [{"role": "user", "content": "What does the list type do?"}]


def ws_generate(address: str, token: str, frames: list[dict]) -> list[dict]:
    async def run():
        received, open_ids = [], {f["request_id"] for f in frames}
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            for frame in frames:
                await ws.send(json.dumps(frame))
            while open_ids:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                received.append(frame)
                if frame["type"] in ("done", "error"):
                    open_ids.discard(frame.get("request_id"))
        return received

    return asyncio.run(run())


def test_openai_streaming_chat_gets_the_websocket_apis_text(daphne_server):
    address, token = daphne_server
    params = {"max_tokens": 32, "temperature": 0}
    frames = ws_generate(address, token, [{"type": "generate", "request_id": "c", "messages": MESSAGES,
                                           "params": params}])
    ws_text = "".join(f["text"] for f in frames if f["type"] == "delta")
    done = frames[-1]
    assert done["type"] == "done" and ws_text

    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token)
    chunks = list(client.chat.completions.create(model="demo", messages=MESSAGES, stream=True,
                                                 stream_options={"include_usage": True}, **params))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == ws_text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == done["finish_reason"]
    assert chunks[-1].usage.completion_tokens == done["usage"]["completion_tokens"]
    whole = client.chat.completions.create(model="demo", messages=MESSAGES, **params)
    assert whole.choices[0].message.content == ws_text and whole.usage.prompt_tokens == done["usage"]["prompt_tokens"]


def test_openai_completions_and_models(daphne_server):
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token)
    frames = ws_generate(address, token, [{"type": "generate", "request_id": "p", "prompt": "The list type",
                                           "params": {"max_tokens": 12, "temperature": 0}}])
    ws_text = "".join(f["text"] for f in frames if f["type"] == "delta")
    result = client.completions.create(model="demo", prompt="The list type", max_tokens=12, temperature=0)
    assert result.choices[0].text == ws_text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="demo", prompt="The list type", max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == ws_text
    assert [m.id for m in client.models.list().data] == ["demo"]


@pytest.mark.parametrize("kwargs, status, param", [
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(temperature=-1), 400, "temperature"),
    (dict(extra_body={"best_of": 3}), 400, "best_of"),
    (dict(n=2), 400, "n"),
])
def test_openai_client_sees_clear_errors(daphne_server, kwargs, status, param):
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="demo", prompt="hi", **kwargs)
    assert caught.value.status_code == status and caught.value.body["param"] == param


def test_a_request_naming_another_model_is_404_model_not_found(daphne_server):
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    for create in (lambda: client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2),
                   lambda: client.completions.create(model="smollm3", prompt="hi", max_tokens=2)):
        with pytest.raises(openai.NotFoundError) as caught:
            create()
        body = caught.value.body
        assert body["code"] == "model_not_found" and body["param"] == "model" and "'demo'" in body["message"]


def test_without_max_tokens_a_chat_reply_may_fill_the_context_and_a_completion_stops_at_16(daphne_server):
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    chat = client.chat.completions.create(model="demo", messages=MESSAGES, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 512  # the demo model's length
    completion = client.completions.create(model="demo", prompt="The list type", temperature=0,
                                           extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 16  # OpenAI's default for completions


def test_a_bad_token_is_refused_over_http_and_websocket(daphne_server):
    address, _ = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key="wb_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    with pytest.raises(websockets.exceptions.InvalidStatus):
        ws_generate(address, "wb_wrong", [{"type": "generate", "request_id": "x", "prompt": "hi"}])


def test_with_debug_off_the_pages_get_their_static_files(daphne_server):
    """The Daphne runs as a deployment does, DEBUG off (its 404 is not Django's debug page), and WhiteNoise
    still serves every asset a page links, byte for byte (Daphne itself serves no static files)."""
    address, _ = daphne_server
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://{address}/no-such-page", timeout=30)
    assert missing.value.code == 404 and b"DEBUG = True" not in missing.value.read()
    login = urllib.request.urlopen(f"http://{address}/login", timeout=30).read().decode()
    assets = re.findall(r'(?:href|src)="/static/([^"]+)"', login)
    assert assets, "liveness: the login page links its stylesheet"
    for asset in assets:
        with urllib.request.urlopen(f"http://{address}/static/{asset}", timeout=30) as response:
            assert response.status == 200 and response.read() == (ROOT / "static" / asset).read_bytes(), asset
