"""Unicode's edge cases through every way text comes in, on the session's shared in-process Daphne: the
websocket API, the OpenAI API, vLLM's /tokenize and /detokenize, and the chat (its socket and its stored
messages). Each edge either comes back exactly (a prompt through /tokenize + /detokenize, a printable request_id
echoed, a chat message as stored) or gets a structured error naming the field (a request_id that is
not printable); never a 500 or a
dropped socket. (Lone surrogates on the websocket and OpenAI APIs: test_hostile_input.py; every frame
shape: test_protocol_fuzz.py.)"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import websockets

from tests.workbench.test_hostile_input import http

pytestmark = pytest.mark.slow  # the shared Daphne's start, when this module runs first

THUMBS_UP = "\U0001f44d"  # four UTF-8 bytes, four tokens of the demo model's byte-level vocabulary
EDGES = {
    "nul": "a\x00b",
    "right-to-left": "\u202eabc\u202c and \u05e9\u05dc\u05d5\u05dd \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "combining": "e\u0301 a\u0300\u0301\u0302\u0303",
    "zwj emoji": "\U0001f469\u200d\U0001f469\u200d\U0001f467 \U0001f1fa\U0001f1f8 " + THUMBS_UP,
    "bom": "\ufeffhello",
    "last code point": "\U0010ffff \uffff \u2028",
}


def post(address: str, token: str, path: str, body: dict | bytes) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    return http(address, "POST", path, raw, Authorization=f"Bearer {token}", Content_Type="application/json")


@pytest.mark.parametrize("name", list(EDGES))
def test_edge_text_comes_back_exactly_through_every_api(inprocess_daphne, name):
    address, token = inprocess_daphne.address, inprocess_daphne.token
    text = EDGES[name]
    status, tokenized = post(address, token, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200, tokenized
    status, detokenized = post(address, token, "/detokenize", {"tokens": tokenized["tokens"]})
    assert status == 200 and detokenized["prompt"] == text, (detokenized, text)

    counted = post(address, token, "/tokenize", {"prompt": text})[1]["count"]  # as the engine is given it
    status, completion = post(address, token, "/v1/completions", {"prompt": text, "max_tokens": 2, "temperature": 0,
                                                                   "stop": [text]})
    assert status == 200 and completion["usage"]["prompt_tokens"] == counted, completion

    # A request_id must be printable (it reaches the workers' logs): an edge that is not is refused as one.
    request_id = text if text.isprintable() else name

    async def over_the_socket() -> tuple[list[dict], dict | None]:
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            refused = None
            if request_id != text:
                await ws.send(json.dumps({"type": "generate", "request_id": text, "prompt": "Hi"}, ensure_ascii=False))
                refused = json.loads(await asyncio.wait_for(ws.recv(), 60))
            await ws.send(json.dumps({"type": "generate", "request_id": request_id, "prompt": text,
                                      "params": {"max_tokens": 2, "temperature": 0, "stop": [text]}},
                                     ensure_ascii=False))
            frames = [json.loads(await asyncio.wait_for(ws.recv(), 60))]
            while frames[-1]["type"] not in ("done", "error"):
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            return frames, refused

    frames, refused = asyncio.run(over_the_socket())
    assert frames[0] == {"type": "accepted", "request_id": request_id}, "the request_id comes back exactly"
    assert frames[-1]["type"] == "done" and frames[-1]["request_id"] == request_id, frames[-1]
    assert frames[-1]["usage"]["prompt_tokens"] == counted
    if refused is not None:
        assert refused["type"] == "error" and refused["code"] == "invalid_request", refused
        assert refused["request_id"] == text and "printable" in refused["message"], refused


def test_a_character_split_across_tokens_is_whole_or_replaced_never_an_error(inprocess_daphne):
    address, token = inprocess_daphne.address, inprocess_daphne.token
    tokens = post(address, token, "/tokenize", {"prompt": THUMBS_UP, "add_special_tokens": False})[1]["tokens"]
    assert len(tokens) == 4, "liveness: the character spans several tokens"
    assert post(address, token, "/detokenize", {"tokens": tokens})[1] == {"prompt": THUMBS_UP}
    status, half = post(address, token, "/detokenize", {"tokens": tokens[:2]})
    assert status == 200 and half["prompt"] == "\ufffd", "half a character reads as U+FFFD, as vLLM answers it"
    # As a prompt of token ids the half character is just tokens: the engine takes them.
    status, completion = post(address, token, "/v1/completions", {"prompt": tokens[:2], "max_tokens": 2, "seed": 0})
    assert status == 200 and completion["usage"]["prompt_tokens"] == 2, completion


def test_bad_bytes_and_lone_surrogates_are_errors_naming_the_field(inprocess_daphne):
    address, token = inprocess_daphne.address, inprocess_daphne.token
    not_utf8 = b'{"prompt": "caf\xe9 \xff\xfe", "max_tokens": 2}'
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        status, answer = post(address, token, path, not_utf8)
        assert status == 400 and answer["error"]["message"], (path, status, answer)
        assert "UTF-8" in answer["error"]["message"] or "JSON" in answer["error"]["message"], (path, answer)
    status, answer = post(address, token, "/tokenize", rb'{"prompt": "ab\ud800"}')
    # Refused as the body is read, so the message names the field (param is left for the fields' own checks).
    assert status == 400 and answer["error"]["message"].startswith("prompt is not valid Unicode text"), answer
    status, answer = post(address, token, "/tokenize", {"messages": [{"role": "user", "content": "\ufeff\x00"}]})
    assert status == 200 and answer["count"] > 0, "NUL and BOM are text like any other to the API"


def test_the_chat_stores_edge_text_exactly_and_refuses_nul_by_name(inprocess_daphne, make_user):
    address = inprocess_daphne.address
    user = make_user(address, "unicode-chatter")
    conversation = user.new_conversation()
    stored = " ".join(text for name, text in EDGES.items() if name != "nul")

    async def chat() -> list[dict]:
        frames = []
        async with websockets.connect(f"ws://{address}/ws/chat/{conversation}",
                                      additional_headers=user.socket_headers()) as ws:
            await ws.send(json.dumps({"type": "send", "content": EDGES["nul"], "params": {"max_tokens": 2}}))
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            await ws.send(json.dumps({"type": "send", "content": stored,
                                      "params": {"max_tokens": 2, "temperature": 0}}, ensure_ascii=False))
            while not frames or frames[-1]["type"] != "done":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        return frames

    frames = asyncio.run(chat())
    assert frames[0] == {"type": "error", "code": "invalid_request",
                         "message": "content: must not contain NUL (U+0000), which the database cannot store"}
    assert frames[-1]["type"] == "done", "the socket answered the next message"
    export = json.loads(user.opener.open(f"{user.base}/c/{conversation}/export.json", timeout=30).read())
    assert export["messages"][0]["content"] == stored, "stored and exported exactly as sent"
    assert len(export["messages"]) == 2, "the refused message stored nothing"

    csrf = next(c.value for c in user.jar if c.name == "csrftoken")

    def change(path: str, body: bytes, content_type: str) -> tuple[int, dict]:
        request = urllib.request.Request(f"{user.base}{path}", body, headers={
            "Content-Type": content_type, "X-CSRFToken": csrf, "Referer": user.base + "/"})
        try:
            response = user.opener.open(request, timeout=30)
            return response.status, {}
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, answer = change(f"/c/{conversation}/rename", b"title=a%00b", "application/x-www-form-urlencoded")
    assert status == 400 and answer["error"]["param"] == "title", answer
    status, answer = change(f"/c/{conversation}/settings", json.dumps({"system_prompt": "a\x00b"}).encode(),
                            "application/json")
    assert status == 400 and answer["error"]["param"] == "system_prompt", answer
    status, answer = change(f"/c/{conversation}/settings", rb'{"system_prompt": "a\ud800b"}', "application/json")
    assert status == 400 and answer["error"]["param"] == "body", answer
    assert "system_prompt is not valid Unicode text" in answer["error"]["message"], answer


def test_a_text_frame_that_is_not_utf8_is_closed_by_daphne_with_1007(inprocess_daphne):
    """RFC 6455: invalid UTF-8 in a text frame fails the connection (1007, invalid frame payload data),
    before any application code sees it; the server serves on."""
    address, token = inprocess_daphne.address, inprocess_daphne.token

    async def run() -> int | None:
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send(b'{"type": "cancel", "request_id": "caf\xe9"}', text=True)
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)
            return ws.close_code

    assert asyncio.run(run()) == 1007
    assert post(address, token, "/tokenize", {"prompt": "still serving"})[0] == 200
