"""The queue-wait and request timeouts (workbench/serving/limits.py): on a stream fed by hand, where
the timing is the test's, and through the websocket API on the in-process engine, where the cancel
must reach the engine. A request that keeps its time is never touched (the control of each)."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.testing import WebsocketCommunicator

from engine import SamplingParams
from workbench.asgi import application
from workbench.serving import bridge, limits
from workbench.serving.inprocess import LOCAL_WORKER
from workbench.serving.streams import RequestStream, StreamEvent

pytestmark = pytest.mark.asyncio


class HandFed:
    """A transport whose streams the test feeds; it records the cancels it gets."""

    def __init__(self) -> None:
        self.canceled: list[str] = []
        self.stream: RequestStream | None = None

    def submit(self, request_id, prompt, params, user="", model=""):
        self.stream = RequestStream(request_id, asyncio.get_running_loop())
        return self.stream

    def cancel(self, request_id: str) -> None:
        self.canceled.append(request_id)


async def submitted(user: str) -> tuple[HandFed, RequestStream]:
    transport = HandFed()
    stream = limits.admit(user).submit(transport, f"{user}-1", "hi", SamplingParams(max_tokens=4))
    return transport, stream


async def test_no_first_output_within_the_queue_timeout_ends_the_request_with_timeout(settings):
    settings.WORKBENCH_QUEUE_TIMEOUT_S, settings.WORKBENCH_REQUEST_TIMEOUT_S = 0.2, 0
    transport, stream = await submitted("queued")
    assert limits.LIMITER.in_flight("queued") == 1
    event = await asyncio.wait_for(stream.next(), 5)
    assert (event.finished, event.error_code) == (True, "timeout") and "WORKBENCH_QUEUE_TIMEOUT_S" in event.error
    assert transport.canceled == ["queued-1"], "the engine is told to let it go"
    assert limits.LIMITER.in_flight("queued") == 0
    stream.push(StreamEvent(finished=True, finish_reason="canceled"))  # the engine's own end, later: dropped
    assert stream.closed and limits.LIMITER.in_flight("queued") == 0

    # The control: a first output in time stops the queue timer for good.
    transport, stream = await submitted("prompt")
    stream.push(StreamEvent(text="a", token_ids=[1]))
    await asyncio.sleep(0.4)
    assert transport.canceled == [] and limits.LIMITER.in_flight("prompt") == 1
    stream.push(StreamEvent(index=1, text="b", token_ids=[2], finished=True, finish_reason="length"))
    assert (await stream.next()).finish_reason == "length" and limits.LIMITER.in_flight("prompt") == 0


async def test_a_request_running_past_the_request_timeout_ends_with_timeout(settings):
    settings.WORKBENCH_QUEUE_TIMEOUT_S, settings.WORKBENCH_REQUEST_TIMEOUT_S = 0, 0.8
    transport, stream = await submitted("long")
    for index in range(3):  # outputs keep coming: only the whole request's time counts
        stream.push(StreamEvent(index=index, text="x", token_ids=[index]))
        await asyncio.sleep(0.1)
    event = await asyncio.wait_for(stream.next(), 5)
    assert event.token_ids == [0, 1, 2] and not event.finished, "outputs keep coming meanwhile"
    event = await asyncio.wait_for(stream.next(), 5)
    assert event.finished and event.error_code == "timeout"
    assert "WORKBENCH_REQUEST_TIMEOUT_S" in event.error and transport.canceled == ["long-1"]
    assert limits.LIMITER.in_flight("long") == 0

    transport, stream = await submitted("quick")  # the control: one that ends in time
    stream.push(StreamEvent(text="x", token_ids=[1], finished=True, finish_reason="stop"))
    await asyncio.sleep(1.0)
    assert transport.canceled == [] and (await stream.next()).finish_reason == "stop"
    assert limits.LIMITER.in_flight("quick") == 0


@pytest.mark.django_db(transaction=True)
async def test_the_websocket_apis_timeout_reaches_the_engine_and_the_socket_goes_on(api_user, settings):
    # The reply runs to the demo model's length (512 positions, 0.7 s on the fastest machine seen), so
    # the timeout is short enough to end it several times over before it could end by itself.
    settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_REQUEST_TIMEOUT_S = "inprocess", 0.1
    ws = WebsocketCommunicator(application, "/ws/v1/generate", headers=[(b"authorization", f"Bearer {api_user[1]}".encode())])
    assert (await ws.connect())[0]
    frames = []

    async def until_end(request_id: str) -> dict:
        while True:
            frames.append(json.loads(await ws.receive_from(timeout=30)))
            if frames[-1].get("request_id") == request_id and frames[-1]["type"] in ("done", "error"):
                return frames[-1]

    transport = bridge.transport()

    def canceled() -> int:
        return transport.metrics_by_worker()[LOCAL_WORKER]["finished"].get("canceled", 0)

    canceled_before = canceled()
    await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": "long", "prompt": "The list type",
                                           "params": {"max_tokens": None, "temperature": 0, "ignore_eos": True}}))
    ended = await until_end("long")
    assert ended["code"] == "timeout" and "0.1 s" in ended["message"], ended
    for _ in range(100):
        if not any("-long" in rid for rid in transport.running_request_ids()):
            break
        await asyncio.sleep(0.05)
    assert not any("-long" in rid for rid in transport.running_request_ids()), "the engine let it go"
    assert canceled() == canceled_before + 1, "canceled there, not run to its end"
    settings.WORKBENCH_REQUEST_TIMEOUT_S = 600
    await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": "next", "prompt": "The list type",
                                           "params": {"max_tokens": 2, "temperature": 0}}))
    assert (await until_end("next"))["type"] == "done"
    await ws.disconnect()
