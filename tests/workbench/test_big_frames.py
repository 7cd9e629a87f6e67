"""Websocket messages of every size up to 64 MB through a real Daphne started as deployments start it
(workbench/serve.py): each is answered with a `frame_too_large` error frame naming the limit while the
socket and its other requests go on, or, past what the server takes in at all, a 1009 close naming that
limit; never a reset with no close frame (what plain `python -m daphne` does past 1 MiB).

The transport plays no part in refusing a frame, so the session's in-process Daphne with limits
(tests/workbench/conftest.py) serves the module, as its user "frames".
"""

from __future__ import annotations

import asyncio
import functools
import json

import pytest
import websockets

from engine import Engine, EngineConfig, SamplingParams
from tests.workbench.test_hostile_input import tokens, until_done
from workbench.serve import APPLICATION, command_line

pytestmark = pytest.mark.slow  # a real Daphne (shared by the session) and real clients

MB = 1_000_000
FRAME_LIMIT = 256 * 1024  # the default WORKBENCH_MAX_FRAME_BYTES, which the error names
SOCKET_LIMIT = 16 * 1024 * 1024  # the default WORKBENCH_SOCKET_MESSAGE_BYTES, which the 1009 close names
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
LONGER = {**GREEDY, "max_tokens": 16}  # the request that runs while the big frames come


@functools.cache
def solo(prompt: str, max_tokens: int) -> list[int]:
    return _engine().generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0,
                                                       ignore_eos=True))[0].token_ids


@functools.cache
def _engine() -> Engine:
    return Engine(EngineConfig(model="demo"))


@pytest.fixture
def server(limited_daphne):
    address, tokens = limited_daphne
    return address, tokens["frames"]


def connect(address: str, token: str):
    return websockets.connect(f"ws://{address}/ws/v1/generate", max_size=None,
                              additional_headers={"Authorization": f"Bearer {token}"})


def big_generate(size: int) -> str:
    return json.dumps({"type": "generate", "request_id": "big", "prompt": "x" * size})


def test_frames_up_to_the_socket_limit_are_refused_whole_and_the_socket_goes_on(server):
    address, token = server

    async def run() -> tuple[list[dict], list[dict]]:
        async with connect(address, token) as ws:
            # Running before, during and after the big frames: refusing one must not touch it.
            await ws.send(json.dumps({"type": "generate", "request_id": "running", "prompt": "The list type",
                                      "params": LONGER}))
            refused = []
            for size in (1 * MB, 2 * MB, 16 * MB):
                await ws.send(big_generate(size))
            frames = []
            while len(refused) < 3:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                (refused if frame["type"] == "error" else frames).append(frame)
            await ws.send(json.dumps({"type": "generate", "request_id": "after", "prompt": "A dictionary is",
                                      "params": GREEDY}))
            frames += await until_done(ws, "after")
            if not any(f.get("request_id") == "running" and f["type"] == "done" for f in frames):
                frames += await until_done(ws, "running")
            return refused, frames

    refused, frames = asyncio.run(run())
    assert [(e["code"], e["request_id"]) for e in refused] == [("frame_too_large", None)] * 3, refused
    assert all(str(FRAME_LIMIT) in e["message"] for e in refused), refused
    assert tokens(frames, "running") == solo("The list type", 16), "the request already running is untouched"
    assert tokens(frames, "after") == solo("A dictionary is", 8), "the socket takes requests after them"


def test_a_message_past_the_socket_limit_closes_with_1009_naming_it_and_others_go_on(server):
    address, token = server

    async def run() -> tuple[websockets.ConnectionClosed, list[dict]]:
        async with connect(address, token) as other:
            await other.send(json.dumps({"type": "generate", "request_id": "other", "prompt": "The list type",
                                         "params": LONGER}))
            async with connect(address, token) as ws:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await ws.send(big_generate(64 * MB))
                    await asyncio.wait_for(ws.recv(), 30)
            return closed.value, await until_done(other, "other")

    closed, others = asyncio.run(run())
    assert closed.rcvd is not None, "the server sent no close frame: the connection was dropped"
    assert closed.rcvd.code == 1009 and str(SOCKET_LIMIT) in closed.rcvd.reason, closed.rcvd
    assert tokens(others, "other") == solo("The list type", 16), "another socket's request is untouched"


def test_the_command_line_keeps_given_options_and_names_the_application():
    assert command_line(["-b", "0.0.0.0", "-p", "8000"], 99) == [
        "--websocket-max-message-size=99", "--websocket-max-frame-size=99", "-b", "0.0.0.0", "-p", "8000",
        APPLICATION]
    assert command_line(["--websocket-max-frame-size=5", "other.asgi:app"], 99) == [
        "--websocket-max-message-size=99", "--websocket-max-frame-size=5", "other.asgi:app"]
