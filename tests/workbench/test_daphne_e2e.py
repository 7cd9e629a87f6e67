"""End to end against a real Daphne: real websocket clients and the official openai package."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request

import jsonschema
import openai
import pytest
import websockets

from engine import Engine, EngineConfig, SamplingParams
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
    [model] = client.models.list().data
    assert (model.id, model.owned_by) == ("demo", "workbench")
    assert model.model_extra == {"root": "demo", "max_model_len": 512}, "the context length where vLLM's clients read it"


@pytest.mark.parametrize("kwargs, status, param", [
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(temperature=-1), 400, "temperature"),
    (dict(extra_body={"best_of": 3}), 400, "best_of"),
    (dict(n=9), 400, "n"),
    (dict(logprobs=21), 400, "logprobs"),
    (dict(extra_body={"top_logprobs": 2}), 400, "top_logprobs"),  # a chat field, not a completions one
    (dict(extra_body={"min_tokens": 20}, max_tokens=4), 400, "min_tokens"),
    (dict(extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}}), 400,
     "stream_options"),
    (dict(extra_body={"user": 5}), 400, "user"),
    (dict(extra_body={"messages": []}), 400, "messages"),  # a chat field, refused on completions
])
def test_openai_client_sees_clear_errors(daphne_server, kwargs, status, param):
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="demo", prompt="hi", **kwargs)
    assert caught.value.status_code == status and caught.value.body["param"] == param


def test_openai_logprobs_are_equal_streamed_and_whole_and_on_the_websocket_api(daphne_server):
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    sampled = dict(max_tokens=10, temperature=0.8, seed=5, extra_body={"ignore_eos": True})
    chat = dict(model="demo", messages=MESSAGES, logprobs=True, top_logprobs=3, **sampled)
    whole = client.chat.completions.create(**chat)
    content = whole.choices[0].logprobs.content
    streamed = [item for c in client.chat.completions.create(**chat, stream=True)
                if c.choices and c.choices[0].logprobs for item in c.choices[0].logprobs.content]
    assert [i.model_dump() for i in streamed] == [i.model_dump() for i in content]
    assert len(content) == whole.usage.completion_tokens == 10
    assert bytes(b for item in content for b in item.bytes).decode() == whole.choices[0].message.content
    assert all(len(item.top_logprobs) == 3 and item.logprob <= 0 for item in content)
    frames = ws_generate(address, token, [{"type": "generate", "request_id": "lp", "messages": MESSAGES, "params": {
        "max_tokens": 10, "temperature": 0.8, "seed": 5, "ignore_eos": True, "logprobs": 3}}])
    socket = [item for f in frames if f["type"] == "delta" for item in f["logprobs"]]
    def without_ids(item: dict) -> dict:
        return {k: v if k != "top_logprobs" else [without_ids(t) for t in v] for k, v in item.items() if k != "token_id"}

    assert [without_ids(item) for item in socket] == [i.model_dump() for i in content]
    assert [item["token_id"] for item in socket] == [t for f in frames if f["type"] == "delta" for t in f["token_ids"]]

    plain = dict(model="demo", prompt="The list type", max_tokens=8, temperature=0, logprobs=2)
    text = client.completions.create(**plain)
    logprobs = text.choices[0].logprobs
    parts = [c.choices[0].logprobs for c in client.completions.create(**plain, stream=True) if c.choices[0].logprobs]
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for part in parts for v in getattr(part, field)] == getattr(logprobs, field)
    assert len(logprobs.tokens) == text.usage.completion_tokens == 8
    assert "".join(logprobs.tokens) == text.choices[0].text
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(8)]
    for chosen, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert len(top) <= 2 and max(top.values()) == pytest.approx(value)  # greedy: the best is chosen


def inprocess_only(request) -> None:
    """For what the web side alone does (n's fan-out, the params' mapping): the Celery run adds time, not cover."""
    if request.node.callspec.params["daphne_server"] != "inprocess":
        pytest.skip("web-side only; the in-process run covers it")


def test_openai_n_choices_are_their_own_sequences_reproducible_with_a_seed(daphne_server, request):
    inprocess_only(request)
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    ask = dict(model="demo", messages=MESSAGES, max_tokens=6, temperature=1.5, seed=11,
               extra_body={"ignore_eos": True})
    first, again = client.chat.completions.create(n=2, **ask), client.chat.completions.create(n=2, **ask)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1] and texts == [c.message.content for c in again.choices]
    assert texts[0] != texts[1], "each choice draws its own tokens"
    assert texts[0] == client.chat.completions.create(**ask).choices[0].message.content  # choice 0 is n=1's
    assert first.usage.completion_tokens == 12 and first.usage.prompt_tokens == again.usage.prompt_tokens
    chunks = list(client.chat.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **ask))
    by_index = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            by_index[choice.index] += choice.delta.content or ""
    assert by_index == texts and chunks[-1].usage.completion_tokens == 12


def ws_choices(address: str, token: str, frames: list[dict], cancel_after: str | None = None) -> list[dict]:
    """The frames of requests sent with `params.n`, until each has had n `done` frames (or an `error`);
    with `cancel_after`, a cancel of that request once its first delta has come."""
    async def run():
        received, dones, to_cancel = [], {f["request_id"]: f["params"]["n"] for f in frames}, cancel_after
        async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                      additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            for frame in frames:
                await ws.send(json.dumps(frame))
            while any(dones.values()):
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                received.append(frame)
                if frame["type"] == "delta" and frame["request_id"] == to_cancel:
                    await ws.send(json.dumps({"type": "cancel", "request_id": to_cancel}))
                    to_cancel = None
                if frame["type"] == "done":
                    dones[frame["request_id"]] -= 1
                elif frame["type"] == "error":
                    dones[frame["request_id"]] = 0
        return received

    return asyncio.run(run())


def test_websocket_n_choices_name_their_choice_and_are_the_openai_apis_choices(daphne_server, request):
    inprocess_only(request)
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    http = client.completions.create(model="demo", prompt="The list type", n=2, max_tokens=6, temperature=1.5,
                                     seed=11, extra_body={"ignore_eos": True})
    params = {"n": 2, "max_tokens": 6, "temperature": 1.5, "seed": 11, "ignore_eos": True}
    # "long" would run to 400 tokens per choice: the cancel must reach both of its sequences.
    frames = ws_choices(address, token, [
        {"type": "generate", "request_id": "two", "prompt": "The list type", "params": params},
        {"type": "generate", "request_id": "long", "prompt": "The list type",
         "params": {"n": 2, "max_tokens": 400, "temperature": 0, "ignore_eos": True}}], cancel_after="long")

    mine = [f for f in frames if f.get("request_id") == "two" and f["type"] != "accepted"]
    assert mine and all(f["type"] in ("delta", "done") and f["choice"] in (0, 1) for f in mine), mine
    for choice in (0, 1):
        deltas = [f for f in mine if f["type"] == "delta" and f["choice"] == choice]
        assert [d["index"] for d in deltas] == [sum(len(x["token_ids"]) for x in deltas[:i]) for i in range(len(deltas))]
        assert "".join(d["text"] for d in deltas) == http.choices[choice].text  # choice i drew with seed + i
    assert http.choices[0].text != http.choices[1].text, "liveness: each choice draws its own tokens"
    dones = [f for f in mine if f["type"] == "done"]
    assert sorted(d["choice"] for d in dones) == [0, 1] and mine[-1] is dones[-1]
    assert dones[0]["usage"] is None and dones[-1]["usage"]["completion_tokens"] == 12  # usage once, at the end
    assert dones[-1]["usage"]["prompt_tokens"] == http.usage.prompt_tokens  # the prompt counted once

    cancelled = [f for f in frames if f.get("request_id") == "long" and f["type"] == "done"]
    assert sorted(d["choice"] for d in cancelled) == [0, 1]
    assert {d["finish_reason"] for d in cancelled} == {"canceled"}, "the cancel stops every choice"
    assert cancelled[-1]["usage"]["completion_tokens"] < 2 * 400


def test_openai_stop_token_ids_end_a_reply_and_min_tokens_hold_them_back(daphne_server, request):
    inprocess_only(request)
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    frames = ws_generate(address, token, [{"type": "generate", "request_id": "g", "prompt": "The list type",
                                           "params": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}}])
    ids = [t for f in frames if f["type"] == "delta" for t in f["token_ids"]]
    ask = dict(model="demo", prompt="The list type", max_tokens=8, temperature=0)
    stopped = client.completions.create(**ask, extra_body={"stop_token_ids": [ids[2]], "ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == ids.index(ids[2]) + 1
    held = client.completions.create(**ask, extra_body={"stop_token_ids": [ids[0]], "min_tokens": 3,
                                                         "ignore_eos": True})
    assert held.usage.completion_tokens >= 3


def celery_only(request) -> None:
    """For what must travel to a worker and back (the params' fields, a constraint compiled there): the
    in-process run is covered by the modules that test it (test_structured_openai.py on SmolLM2)."""
    if request.node.callspec.params["daphne_server"] != "celery":
        pytest.skip("covered in-process elsewhere; this is the Celery transport's check")


CODE = {"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"}
THING = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
         "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                        "color": {"enum": ["red", "green", "blue"]}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
                                           "parameters": {"type": "object", "additionalProperties": False,
                                                          "required": ["word"],
                                                          "properties": {"word": {"type": "string", "maxLength": 12}}}}}


def test_response_format_and_a_forced_tool_call_travel_to_the_celery_workers(daphne_server, request):
    celery_only(request)
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    # Seeded sampling that the demo model, left alone, never writes as such a code: the worker's
    # constrained output is exactly the engine's own for the same request.
    ask = dict(max_tokens=20, temperature=1.0, seed=4)
    coded = client.completions.create(model="demo", prompt="The list type", extra_body={"response_format": CODE}, **ask)
    [expected] = Engine(EngineConfig(model="demo")).generate(["The list type"],
                                                             SamplingParams(response_format=CODE, **ask))
    assert re.fullmatch(CODE["regex"], coded.choices[0].text) and coded.choices[0].text == expected.text
    assert coded.choices[0].finish_reason == "stop"
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": THING}}
    thing = client.chat.completions.create(model="demo", messages=MESSAGES, response_format=fmt,
                                           **{**ask, "max_tokens": 40})  # room for the whole object
    jsonschema.validate(json.loads(thing.choices[0].message.content), THING)
    assert thing.choices[0].finish_reason == "stop"

    # Sampled at OpenAI's default temperature 1, so seeded: unseeded, some draws ran past max_tokens.
    forced = client.chat.completions.create(model="demo", messages=MESSAGES, tools=[LOOKUP], max_tokens=40, seed=4,
                                            tool_choice={"type": "function", "function": {"name": "lookup"}})
    [call] = forced.choices[0].message.tool_calls
    assert forced.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"
    jsonschema.validate(json.loads(call.function.arguments), LOOKUP["function"]["parameters"])


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                                          "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}


def test_a_forced_tool_call_cut_by_max_tokens_keeps_its_arguments_so_far(daphne_server):
    """As OpenAI answers it: finish_reason `length`, and the call with the arguments generated so far (a
    JSON string that does not parse yet), whole and streamed alike, through either transport."""
    address, token = daphne_server
    client = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)
    forced = dict(model="demo", messages=MESSAGES, tools=[WEATHER], temperature=1.0, seed=4,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(max_tokens=80, **forced)
    [call] = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls", "liveness: with room, the seeded call ends whole"
    # The grammar writes the arguments compact; the call's own are normalized (json.dumps) once whole.
    compact = json.dumps(json.loads(call.function.arguments), separators=(",", ":"))
    max_tokens = whole.usage.completion_tokens - CUT_BEFORE_THE_END
    cut = client.chat.completions.create(max_tokens=max_tokens, **forced).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None, cut
    [partial] = cut.message.tool_calls
    arguments = partial.function.arguments
    assert partial.function.name == "get_weather" and partial.id.startswith("call_") and partial.type == "function"
    assert arguments and compact.startswith(arguments) and arguments != compact, (arguments, compact)

    chunks = list(client.chat.completions.create(max_tokens=max_tokens, stream=True, **forced))
    pieces = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert pieces[0].function.name == "get_weather" and pieces[0].id.startswith("call_")
    assert "".join(p.function.arguments or "" for p in pieces) == arguments
    assert not any(c.choices[0].delta.content for c in chunks if c.choices), "no content: the call is all"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


# Tokens taken off the whole call's count: the cut then falls inside its arguments (the demo model,
# seed 4: 8 left the arguments whole, in the closing `}}`, newline and tag; 16 cuts inside them).
CUT_BEFORE_THE_END = 16


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
