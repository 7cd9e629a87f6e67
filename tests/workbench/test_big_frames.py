"""Websocket messages of every size up to 64 MB through a real Daphne started as deployments start it
(workbench/serve.py): each is answered with a `frame_too_large` error frame naming the limit while the
socket and its other requests go on, or, past what the server takes in at all, a 1009 close naming that
limit; never a reset with no close frame (what plain `python -m daphne` does past 1 MiB).

The transport plays no part in refusing a frame, so the session's in-process Daphne with limits
(tests/workbench/conftest.py) serves the module, each test as a user of its own.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.reference import greedy_solo as solo
from tests.workbench.test_hostile_input import next_frame, tokens, until_done
from workbench.serve import APPLICATION, command_line

pytestmark = pytest.mark.slow  # a real Daphne (shared by the session) and real clients

MB = 1_000_000
FRAME_LIMIT = 256 * 1024  # the default WORKBENCH_MAX_FRAME_BYTES, which the error names
SOCKET_LIMIT = 16 * 1024 * 1024  # the default WORKBENCH_SOCKET_MESSAGE_BYTES, which the 1009 close names
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
LONGER = {**GREEDY, "max_tokens": 16}  # the request that runs while the big frames come


# How long a socket may stay silent while a request is under way. Generous: the limited Daphne may be
# loading its model, on a loaded machine, when the first request comes.
STALL_S = 90


def connect(address: str, token: str):
    return websockets.connect(f"ws://{address}/ws/v1/generate", max_size=None,
                              additional_headers={"Authorization": f"Bearer {token}"})


def big_generate(size: int) -> str:
    return json.dumps({"type": "generate", "request_id": "big", "prompt": "x" * size})


def frame_of(size: int, pad: str = "x") -> str:
    """A cancel frame of exactly `size` UTF-8 bytes (padded with `pad`, 1 or 2 bytes a character):
    one the server parses is answered with unknown_request_id, so what a size gets says which side of
    the frame limit it fell on, without a generation."""
    head = '{"type": "cancel", "request_id": "nope", "pad": "'
    room = size - len(head.encode()) - 2
    width = len(pad.encode())
    text = head + pad * (room // width) + "x" * (room % width) + '"}'
    assert len(text.encode()) == size
    return text


# Every size class up to the socket limit, and each limit's edge to the byte; all on one socket.
REFUSED_WHOLE = [1 * MB, 2 * MB, 4 * MB, 8 * MB, SOCKET_LIMIT - 1, SOCKET_LIMIT]
PAST_THE_SOCKET_LIMIT = [SOCKET_LIMIT + 1, 32 * MB, 64 * MB]


def test_frames_up_to_the_socket_limit_are_refused_whole_and_the_socket_goes_on(limited_daphne):
    address, token = limited_daphne[0], limited_daphne[1]["frames"]
    # (frame, the error code it must get), in the order sent
    sent = [(frame_of(FRAME_LIMIT - 1), "unknown_request_id"), (frame_of(FRAME_LIMIT), "unknown_request_id"),
            (frame_of(FRAME_LIMIT + 1), "frame_too_large"),
            # Counted in bytes, not characters: fewer characters than the limit, more bytes.
            (frame_of(FRAME_LIMIT + 1, pad="\u00e9"), "frame_too_large"),
            *[(frame_of(size), "frame_too_large") for size in REFUSED_WHOLE],
            (big_generate(3 * MB), "frame_too_large")]

    async def run() -> tuple[list[dict], list[dict]]:
        async with connect(address, token) as ws:
            # Running before, during and after the big frames: refusing one must not touch it.
            await ws.send(json.dumps({"type": "generate", "request_id": "running", "prompt": "The list type",
                                      "params": LONGER}))
            refused = []
            for text, _ in sent:
                await ws.send(text)
            frames = []
            while len(refused) < len(sent):
                frame = await next_frame(ws, "the refusals", refused + frames, STALL_S)
                (refused if frame["type"] == "error" else frames).append(frame)
            await ws.send(json.dumps({"type": "generate", "request_id": "after", "prompt": "A dictionary is",
                                      "params": GREEDY}))
            frames += await until_done(ws, "after", refused + frames, STALL_S)
            if not any(f.get("request_id") == "running" and f["type"] == "done" for f in frames):
                frames += await until_done(ws, "running", refused + frames, STALL_S)
            return refused, frames

    refused, frames = asyncio.run(run())
    assert [e["code"] for e in refused] == [code for _, code in sent], refused
    too_large = [e for e in refused if e["code"] == "frame_too_large"]
    assert all(e["request_id"] is None and str(FRAME_LIMIT) in e["message"] for e in too_large), too_large
    assert all(e["request_id"] == "nope" for e in refused if e["code"] == "unknown_request_id"), refused
    assert tokens(frames, "running") == solo("The list type", 16), "the request already running is untouched"
    assert tokens(frames, "after") == solo("A dictionary is", 8), "the socket takes requests after them"


def fragments(size: int, piece: int = MB):
    """One text message of `size` bytes sent as many websocket frames (each far under the limit):
    the limit is on the message, whatever its frames."""
    text = frame_of(size)
    return (text[i:i + piece] for i in range(0, size, piece))


def test_a_message_past_the_socket_limit_closes_with_1009_naming_it_and_others_go_on(limited_daphne):
    # A user of its own: requests the test above may leave under way must not fill this one's limits.
    address, token = limited_daphne[0], limited_daphne[1]["frames-1009"]

    async def run() -> tuple[list[websockets.ConnectionClosed], list[dict]]:
        closes = []
        async with connect(address, token) as other:
            await other.send(json.dumps({"type": "generate", "request_id": "other", "prompt": "The list type",
                                         "params": LONGER}))
            for message in [*(big_generate(size) for size in PAST_THE_SOCKET_LIMIT), frame_of(SOCKET_LIMIT + 1),
                            fragments(20 * MB)]:
                async with connect(address, token) as ws:
                    with pytest.raises(websockets.ConnectionClosed) as closed:
                        await ws.send(message)
                        await asyncio.wait_for(ws.recv(), STALL_S)
                closes.append(closed.value)
            return closes, await until_done(other, "other", stall_s=STALL_S)

    closes, others = asyncio.run(run())
    for closed in closes:
        assert closed.rcvd is not None, "the server sent no close frame: the connection was dropped"
        assert closed.rcvd.code == 1009 and str(SOCKET_LIMIT) in closed.rcvd.reason, closed.rcvd
    assert tokens(others, "other") == solo("The list type", 16), "another socket's request is untouched"


def test_the_command_line_keeps_given_options_and_names_the_application():
    assert command_line(["-b", "0.0.0.0", "-p", "8000"], 99) == [
        "--websocket-max-message-size=99", "--websocket-max-frame-size=99", "-b", "0.0.0.0", "-p", "8000",
        APPLICATION]
    assert command_line(["--websocket-max-frame-size=5", "other.asgi:app"], 99) == [
        "--websocket-max-message-size=99", "--websocket-max-frame-size=5", "other.asgi:app"]
