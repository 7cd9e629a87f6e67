"""One rule per input, seen from the clients: the websocket API, the chat socket and the OpenAI views
refuse the same bad sampling values (and the two with raw prompts the same bad prompts) with the same
error code and accept the same good ones; the three sockets limit and refuse frames the same way."""

from __future__ import annotations

import json
import math

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import AsyncClient

from tests.workbench.test_chat import as_user
from tests.workbench.test_dashboard import dashboard
from tests.workbench.test_websocket_api import connect
from workbench.chat.models import Conversation

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

# Values of the parameters all three ways in take, each refused for its JSON type or range, never coerced.
BAD_PARAMS = [
    {"ignore_eos": 1}, {"ignore_eos": 0}, {"ignore_eos": "true"},
    {"max_tokens": True}, {"max_tokens": 4.0}, {"max_tokens": "4"}, {"max_tokens": 0},
    {"temperature": True}, {"temperature": "0"}, {"temperature": math.nan}, {"top_p": math.inf},
    {"top_k": 2.5}, {"top_k": False}, {"min_p": True}, {"seed": True}, {"seed": 1.5},
    {"frequency_penalty": "0"}, {"presence_penalty": True}, {"repetition_penalty": False},
    {"stop": [1]}, {"stop": [""]}, {"stop": True},
]
GOOD_PARAMS = [
    {"max_tokens": 2, "temperature": 0, "ignore_eos": True},
    {"max_tokens": 2, "temperature": 0.5, "top_p": 1, "top_k": 3, "min_p": 0, "seed": 7, "stop": ["zzz"],
     "ignore_eos": False, "frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.1},
    {"max_tokens": 2, "temperature": 1, "stop": "zzz", "seed": -1},
]
BAD_PROMPTS = [[True, 5], [False], [1.0], [5, "a"], 5, None, {"text": "hi"}]
GOOD_PROMPTS = ["The list type", [5, 6, 7]]


async def frame(ws: WebsocketCommunicator, kinds: tuple[str, ...]) -> dict:
    """The next frame whose type is one of `kinds` (the dashboard's state frames and deltas pass by)."""
    while True:
        received = json.loads(await ws.receive_from(timeout=30))
        if received["type"] in kinds:
            return received


async def api_answers(token: str, bodies: list[dict]) -> list[dict]:
    """The websocket API's last frame for each generate frame of `bodies` (an error, or done)."""
    ws, answers = await connect(token), []
    for n, body in enumerate(bodies):
        await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": f"r{n}", **body}))
        answers.append(await frame(ws, ("error", "done")))
    await ws.disconnect()
    return answers


async def chat_answers(user, params: list[object]) -> list[dict]:
    """The chat socket's last frame for a message sent with each of `params` (an error, or done)."""
    conversation = await Conversation.objects.acreate(owner=user)
    ws, answers = WebsocketCommunicator(as_user(user), f"/ws/chat/{conversation.pk}"), []
    assert (await ws.connect())[0]
    for each in params:
        await ws.send_to(text_data=json.dumps({"type": "send", "content": "hi", "params": each}))
        answers.append(await frame(ws, ("error", "done")))
    await ws.disconnect()
    return answers


async def openai_answer(token: str, path: str, body: dict) -> tuple[int, dict]:
    response = await AsyncClient().post(f"/v1/{path}", data=json.dumps(body), content_type="application/json",
                                        headers={"Authorization": f"Bearer {token}"})
    return response.status_code, json.loads(response.content)


async def test_bad_sampling_values_are_invalid_params_on_every_way_in(api_user):
    user, token = api_user
    on_api = await api_answers(token, [{"prompt": "hi", "params": p} for p in BAD_PARAMS])
    on_chat = await chat_answers(user, BAD_PARAMS)
    for params, api, chat in zip(BAD_PARAMS, on_api, on_chat):
        [name] = params
        assert (api["type"], api["code"]) == ("error", "invalid_params") and name in api["message"], (params, api)
        assert (chat["type"], chat["code"]) == ("error", "invalid_params") and name in chat["message"], (params, chat)
        assert chat["message"] == api["message"], "one rule, one message"
        for path, prompt in (("completions", {"prompt": "hi"}), ("chat/completions",
                                                                 {"messages": [{"role": "user", "content": "hi"}]})):
            status, answer = await openai_answer(token, path, {**prompt, **params})
            assert status == 400 and answer["error"]["code"] == "invalid_params", (path, params, answer)
            assert answer["error"]["param"] == name and answer["error"]["message"] == api["message"]


async def test_good_sampling_values_are_served_on_every_way_in(api_user):
    user, token = api_user
    on_api = await api_answers(token, [{"prompt": "hi", "params": p} for p in GOOD_PARAMS])
    on_chat = await chat_answers(user, GOOD_PARAMS)
    for params, api, chat in zip(GOOD_PARAMS, on_api, on_chat):
        assert api["type"] == "done" and api["usage"]["completion_tokens"] == 2, (params, api)
        assert chat["type"] == "done" and chat["usage"]["completion_tokens"] == 2, (params, chat)
        for path, prompt in (("completions", {"prompt": "hi"}), ("chat/completions",
                                                                 {"messages": [{"role": "user", "content": "hi"}]})):
            status, answer = await openai_answer(token, path, {**prompt, **params})
            assert status == 200 and answer["usage"]["completion_tokens"] == 2, (path, params, answer)


async def test_params_that_are_not_an_object_are_refused_on_both_sockets(api_user):
    user, token = api_user
    not_objects = ["fast", None, [], 0, False]
    on_api = await api_answers(token, [{"prompt": "hi", "params": p} for p in not_objects])
    on_chat = await chat_answers(user, not_objects)
    assert [(a["code"], c["code"]) for a, c in zip(on_api, on_chat)] == [("invalid_params",) * 2] * len(not_objects)


async def test_raw_prompts_follow_one_rule_on_the_websocket_api_and_the_completions_view(api_user):
    _, token = api_user
    params = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
    on_api = await api_answers(token, [{"prompt": p, "params": params} for p in BAD_PROMPTS + GOOD_PROMPTS])
    for prompt, api in zip(BAD_PROMPTS + GOOD_PROMPTS, on_api):
        status, answer = await openai_answer(token, "completions", {"prompt": prompt, **params})
        if prompt in GOOD_PROMPTS:
            assert api["type"] == "done" and status == 200, (prompt, api, answer)
            counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cached_tokens: nested on OpenAI's
            assert {k: answer["usage"][k] for k in counts} == {k: api["usage"][k] for k in counts}
        else:
            assert (api["type"], api["code"]) == ("error", "invalid_request"), (prompt, api)
            assert status == 400 and answer["error"]["code"] == "invalid_request", (prompt, answer)
            assert answer["error"]["param"] == "prompt" and answer["error"]["message"] == api["message"]


async def test_n_is_a_json_integer_by_one_rule_on_the_openai_views_and_the_websocket_api(api_user):
    _, token = api_user
    bad = (1.0, True, "1", 0, 9)
    on_api = await api_answers(token, [{"prompt": "hi", "params": {"max_tokens": 1, "n": n}} for n in bad])
    for n, api in zip(bad, on_api):
        status, answer = await openai_answer(token, "completions", {"prompt": "hi", "max_tokens": 1, "n": n})
        assert status == 400 and (answer["error"]["param"], answer["error"]["code"]) == ("n", "invalid_params"), answer
        assert (api["type"], api["code"], api["message"]) == ("error", "invalid_params", answer["error"]["message"]), api
    assert (await openai_answer(token, "completions", {"prompt": "hi", "max_tokens": 1, "n": 1, "seed": 0}))[0] == 200


async def sockets(api_user, operator) -> dict[str, tuple[WebsocketCommunicator, dict, str]]:
    """Each of the three sockets, open, with a frame of its own that it refuses once parsed, and the code."""
    conversation = await Conversation.objects.acreate(owner=api_user[0])
    chat = WebsocketCommunicator(as_user(api_user[0]), f"/ws/chat/{conversation.pk}")
    assert (await chat.connect())[0]
    return {"api": (await connect(api_user[1]), {"type": "cancel", "request_id": "none"}, "unknown_request_id"),
            "chat": (chat, {"type": "launch"}, "unknown_type"),
            "dashboard": (await dashboard(operator), {"type": "launch"}, "invalid_frame")}


def padded(frame: dict, size: int) -> str:
    """`frame` as JSON text of exactly `size` bytes in UTF-8, padded with two-byte characters (and one
    ASCII one where the count is odd): fewer characters than bytes, so a character count would differ."""
    empty = len(json.dumps({**frame, "pad": ""}, ensure_ascii=False).encode())
    wide, narrow = divmod(size - empty, 2)
    text = json.dumps({**frame, "pad": "é" * wide + "x" * narrow}, ensure_ascii=False)
    assert len(text.encode()) == size and len(text) < size
    return text


async def test_the_three_sockets_count_frames_in_bytes_before_parsing_and_refuse_them_alike(api_user, operator):
    limit = settings.WORKBENCH_MAX_FRAME_BYTES
    for name, (ws, refused, code) in (await sockets(api_user, operator)).items():
        await ws.send_to(text_data=padded(refused, limit))
        assert (await frame(ws, ("error",)))["code"] == code, f"{name}: a frame of exactly the limit is parsed"
        answers = []
        for oversized in (padded(refused, limit + 1), "[" * (limit + 1)):
            await ws.send_to(text_data=oversized)
            answers.append(await frame(ws, ("error",)))
        await ws.send_to(bytes_data=b"x" * (limit + 1))
        answers.append(await frame(ws, ("error",)))
        await ws.send_to(bytes_data=b"{}")
        answers.append(await frame(ws, ("error",)))
        assert [a["code"] for a in answers] == ["frame_too_large"] * 3 + ["invalid_frame"], (name, answers)
        assert all(str(limit) in a["message"] for a in answers[:3])
        await ws.disconnect()
