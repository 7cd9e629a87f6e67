"""The websocket API in-process (Channels' WebsocketCommunicator), where the engine can be inspected:
multiplexing, cancel and disconnect reaching the engine, every protocol error, auth; each against the
in-process engine and against real Celery workers over Redis."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings

from tests.reference import greedy_solo
from workbench.asgi import application
from workbench.serving import bridge

# What may still arrive after a cancel: tokens already decoded or on their way (a burst, a coalesced
# delta in flight). A cancel that waited for hundreds of steps would exceed it.
MAX_TOKENS_AFTER_CANCEL = 48

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("serving_transport")]


async def connect(token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    communicator = WebsocketCommunicator(application, "/ws/v1/generate", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def frames_until_done(ws: WebsocketCommunicator, request_ids: set[str], timeout: float = 30,
                            end_on_error: bool = True) -> list[dict]:
    frames, open_ids = [], set(request_ids)
    while open_ids:
        frame = json.loads(await ws.receive_from(timeout=timeout))
        frames.append(frame)
        ends = frame["type"] == "done" or (end_on_error and frame["type"] == "error")
        if ends and frame.get("request_id") in open_ids:
            open_ids.discard(frame["request_id"])
    return frames


async def test_two_requests_multiplex_on_one_socket_and_each_gets_its_own_tokens(api_user):
    ws = await connect(api_user[1])
    prompts = {"a": "The list type", "b": "A dictionary is"}
    for rid, prompt in prompts.items():
        await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": rid, "prompt": prompt,
                                               "params": {"max_tokens": 16, "temperature": 0, "ignore_eos": True}}))
    frames = await frames_until_done(ws, set(prompts))
    for rid, prompt in prompts.items():
        mine = [f for f in frames if f.get("request_id") == rid]
        assert mine[0]["type"] == "accepted" and mine[-1]["type"] == "done"
        deltas = [f for f in mine if f["type"] == "delta"]
        assert [d["index"] for d in deltas] == [sum(len(x["token_ids"]) for x in deltas[:i]) for i in range(len(deltas))]
        assert [t for d in deltas for t in d["token_ids"]] == greedy_solo(prompt, 16)
        assert mine[-1]["finish_reason"] == "length" and mine[-1]["usage"]["completion_tokens"] == 16
    await ws.disconnect()


async def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Poll `predicate` on the event loop's own thread, unlike tests/waiting.py's async_wait_until: it
    reads the in-process transport, which the consumer under test changes on this loop."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


async def frames_so_far(ws: WebsocketCommunicator) -> list[dict]:
    """Every frame the server has sent until now (nothing waited for)."""
    frames = []
    while not ws.output_queue.empty():
        frames.append(json.loads(await ws.receive_from(timeout=1)))
    return frames


def engine_runs(fragment: str) -> bool:
    return any(fragment in rid for rid in bridge.transport().running_request_ids())


async def test_cancel_stops_the_sequence_in_the_engine(api_user):
    # No max_tokens: the reply runs to the model's length, well past the Celery roster's lag in engine_runs.
    ws = await connect(api_user[1])
    await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": "long", "prompt": "x",
                                           "params": {"max_tokens": None, "ignore_eos": True, "temperature": 0}}))
    assert json.loads(await ws.receive_from(timeout=10))["type"] == "accepted"
    first = json.loads(await ws.receive_from(timeout=10))
    assert first["type"] == "delta"
    assert await wait_for(lambda: engine_runs("-long")), "liveness: the engine is running it"
    last = [f for f in [first, *await frames_so_far(ws)] if f["type"] == "delta"][-1]
    delivered = last["index"] + len(last["token_ids"])
    await ws.send_to(text_data=json.dumps({"type": "cancel", "request_id": "long"}))
    frames = await frames_until_done(ws, {"long"})
    assert frames[-1]["type"] == "done" and frames[-1]["finish_reason"] == "canceled"
    after_cancel = frames[-1]["usage"]["completion_tokens"] - delivered
    assert after_cancel <= MAX_TOKENS_AFTER_CANCEL, f"{after_cancel} tokens came after the cancel"
    assert await wait_for(lambda: not engine_runs("-long"))
    await ws.disconnect()


async def test_disconnect_stops_the_sequence_in_the_engine(api_user):
    ws = await connect(api_user[1])
    await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": "gone", "prompt": "x",
                                           "params": {"max_tokens": None, "ignore_eos": True, "temperature": 0}}))
    await ws.receive_from(timeout=10)
    await ws.receive_from(timeout=10)
    assert await wait_for(lambda: engine_runs("-gone")), "liveness: the engine is running it"
    await ws.disconnect()
    assert await wait_for(lambda: not engine_runs("-gone"))


BAD_FRAMES = [
    ("not json", "invalid_json"),
    (json.dumps([1, 2]), "invalid_request"),
    (json.dumps({"type": "launch", "request_id": "x"}), "unknown_type"),
    (json.dumps({"type": "generate", "prompt": "hi"}), "invalid_request"),
    (json.dumps({"type": "generate", "request_id": 7, "prompt": "hi"}), "invalid_request"),
    (json.dumps({"type": "generate", "request_id": "p", "prompt": 5}), "invalid_request"),
    (json.dumps({"type": "generate", "request_id": "p", "prompt": "a", "messages": []}), "invalid_request"),
    (json.dumps({"type": "generate", "request_id": "p", "messages": [{"role": "user"}]}), "invalid_request"),
    (json.dumps({"type": "generate", "request_id": "p", "prompt": "hi", "params": {"max_tokens": 0}}), "invalid_params"),
    (json.dumps({"type": "generate", "request_id": "p", "prompt": "hi", "params": {"temprature": 1}}), "invalid_params"),
    (json.dumps({"type": "generate", "request_id": "p", "prompt": "hi", "params": "fast"}), "invalid_params"),
    (json.dumps({"type": "cancel", "request_id": "never-started"}), "unknown_request_id"),
    (json.dumps({"type": "generate", "request_id": "big", "prompt": "x" * 300_000}), "frame_too_large"),
    # Lone surrogates (JSON escapes UTF-8 cannot carry), anywhere a string goes; and nesting past json's
    # recursion limit.
    (r'{"type": "generate", "request_id": "p", "prompt": "abc\ud800def"}', "invalid_request"),
    (r'{"type": "generate", "request_id": "x\ud800", "prompt": "hi"}', "invalid_request"),
    (r'{"type": "cancel", "request_id": "\udc00"}', "invalid_request"),
    (r'{"type": "generate", "request_id": "p", "prompt": "hi", "params": {"\ud800": 1}}', "invalid_request"),
    (r'{"type": "generate", "request_id": "p", "prompt": "hi", "params": {"stop": ["\ud800"]}}', "invalid_request"),
    (r'{"type": "generate", "request_id": "p", "messages": [{"role": "user", "content": "hi\ud800"}]}',
     "invalid_request"),
    ("[" * 50_000, "invalid_json"),
    (json.dumps({"type": "generate", "request_id": "p", "prompt": "hi", "params": {"logprobs": 21}}), "invalid_params"),
    (json.dumps({"type": "generate", "request_id": "m", "prompt": "hi", "model": "gpt-4o"}), "model_not_found"),
]


@pytest.mark.parametrize("frame, code", BAD_FRAMES)
async def test_a_bad_frame_gets_an_error_and_the_socket_keeps_working(api_user, frame, code):
    ws = await connect(api_user[1])
    # The good request names the served model (it may; tests/e2e/test_model_selector.py has several).
    await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": "ok", "prompt": "The list type",
                                           "model": settings.WORKBENCH_MODEL,
                                           "params": {"max_tokens": 24, "temperature": 0, "ignore_eos": True}}))
    await ws.send_to(text_data=frame)
    frames = await frames_until_done(ws, {"ok"})
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == [code] and errors[0]["message"]
    ok = [f for f in frames if f.get("request_id") == "ok"]
    assert ok[-1]["type"] == "done" and [t for f in ok if f["type"] == "delta" for t in f["token_ids"]] == \
        greedy_solo("The list type", 24)
    await ws.disconnect()


async def test_duplicate_request_id_is_refused_while_the_first_runs(api_user):
    ws = await connect(api_user[1])
    frame = json.dumps({"type": "generate", "request_id": "dup", "prompt": "x",
                        "params": {"max_tokens": 40, "ignore_eos": True, "seed": 0}})
    await ws.send_to(text_data=frame)
    await ws.send_to(text_data=frame)
    frames = await frames_until_done(ws, {"dup"}, end_on_error=False)
    assert [f["code"] for f in frames if f["type"] == "error"] == ["duplicate_request_id"]
    assert frames[-1]["type"] == "done" and frames[-1]["usage"]["completion_tokens"] == 40
    await ws.disconnect()


async def test_another_users_request_cannot_be_cancelled(api_user, django_user_model):
    from workbench.api.models import ApiToken

    mallory = await asyncio.to_thread(django_user_model.objects.create_user, "mallory")
    _, mallory_token = await asyncio.to_thread(ApiToken.issue, mallory)
    alice, mallory_ws = await connect(api_user[1]), await connect(mallory_token)
    await alice.send_to(text_data=json.dumps({"type": "generate", "request_id": "mine", "prompt": "x",
                                              "params": {"max_tokens": 60, "ignore_eos": True, "seed": 0}}))
    await alice.receive_from(timeout=10)
    await mallory_ws.send_to(text_data=json.dumps({"type": "cancel", "request_id": "mine"}))
    error = json.loads(await mallory_ws.receive_from(timeout=10))
    assert error["type"] == "error" and error["code"] == "unknown_request_id"
    frames = await frames_until_done(alice, {"mine"})
    assert frames[-1]["finish_reason"] == "length" and frames[-1]["usage"]["completion_tokens"] == 60
    await alice.disconnect()
    await mallory_ws.disconnect()


@pytest.mark.parametrize("token", [None, "wb_not-a-real-token", "revoked"])
async def test_a_socket_without_a_valid_token_is_refused(api_user, token):
    if token == "revoked":
        from workbench.api.models import ApiToken

        token = api_user[1]
        await asyncio.to_thread(lambda: ApiToken.objects.get(user=api_user[0]).revoke())
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    communicator = WebsocketCommunicator(application, "/ws/v1/generate", headers=headers)
    connected, code = await communicator.connect()
    assert not connected and code == 4401
