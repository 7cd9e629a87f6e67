"""A real Daphne's websockets driven from synchronous code (a Hypothesis test), for
tests/workbench/test_protocol_fuzz.py.

Hypothesis runs each example as a plain call, while a socket lives on one event loop: so the loop runs in
a thread of its own for the whole test, and each example hands it a coroutine. Each socket's frames are
read by one task into a list as they come, so what the server sent is one ordered record that the checks
read by position; a close is recorded too (code and reason), so a check waiting for a frame fails at
once, naming it, instead of timing out.

A server answers a socket's frames in order, so "what did this frame get at once" is read by sending a
marker frame after it, one whose answer is known (`Marker`), and taking the frames between.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import websockets


T = TypeVar("T")
MARKER = "\u2063marker-"  # an invisible separator first: no fuzzed request_id or type is drawn with it


class Loop:
    """An event loop on a thread; `run(coroutine)` waits for its result from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Awaitable[T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass(frozen=True)
class Marker:
    """How a socket's marker looks: `frame(name)` is sent, and `answers(frame, name)` finds its reply.
    The websocket API's marker is a cancel of an id no one uses (unknown_request_id echoing it); the chat's
    and the dashboard's a frame of an unknown type (the chat's error names it in its message, the
    dashboard's echoes its `id`)."""

    frame: Callable[[str], dict]
    answers: Callable[[dict, str], bool]


API_MARKER = Marker(lambda name: {"type": "cancel", "request_id": name},
                    lambda f, name: f.get("request_id") == name and f["type"] == "error"
                    and f["code"] == "unknown_request_id")
CHAT_MARKER = Marker(lambda name: {"type": name},
                     lambda f, name: f["type"] == "error" and f.get("code") == "unknown_type"
                     and repr(name) in f["message"])  # the message shows the type as Python's repr
DASHBOARD_MARKER = Marker(lambda name: {"type": name, "id": name},
                          lambda f, name: f["type"] == "error" and f.get("id") == name)


class SocketClosed(AssertionError):
    """The server closed a socket that a check still waited on: the fuzzer's finding."""


class Socket:
    """A websocket to a real Daphne (`headers`: the bearer token or the session cookie) whose every
    frame is kept, in order, in `frames`; `skip(frame)` leaves out frames the checks never read (the
    dashboard's periodic state)."""

    def __init__(self, url: str, headers: dict[str, str], marker: Marker = API_MARKER,
                 skip: Callable[[dict], bool] = lambda frame: False) -> None:
        self.url, self.headers, self.marker, self.skip = url, headers, marker, skip
        self.frames: list[dict] = []
        self.closed: tuple[int | None, str] | None = None
        self.arrived = asyncio.Event()
        self.markers = itertools.count()

    async def open(self) -> Socket:
        self.connection = await websockets.connect(self.url, additional_headers=self.headers, max_size=None)
        self.reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            async for text in self.connection:
                frame = json.loads(text)
                if not self.skip(frame):
                    self.frames.append(frame)
                    self.arrived.set()
        finally:
            self.closed = (self.connection.close_code, self.connection.close_reason or "")
            self.arrived.set()

    async def send(self, frame: dict | str | bytes) -> None:
        """A dict is sent as its JSON; a str as it is (text that need not be JSON); bytes as a binary frame."""
        await self.connection.send(json.dumps(frame) if isinstance(frame, dict) else frame)

    async def wait_for(self, found: Callable[[int, dict], bool], start: int = 0, timeout: float = 30) -> int:
        """The position of the first frame at or after `start` that `found(position, frame)`."""
        async def scan() -> int:
            at = start
            while True:
                for at in range(at, len(self.frames)):
                    if found(at, self.frames[at]):
                        return at
                at = len(self.frames)
                if self.closed is not None:
                    raise SocketClosed(f"the server closed the socket {self.closed}; last frames {self.frames[-3:]}")
                self.arrived.clear()
                await self.arrived.wait()
        try:
            return await asyncio.wait_for(scan(), timeout)
        except TimeoutError:
            raise AssertionError(f"nothing awaited came within {timeout} s; last frames {self.frames[-4:]}") from None

    async def exchange(self, frame: dict | str | bytes) -> tuple[int, int]:
        """Send `frame`, then a marker, and wait for the marker's answer: whatever `frame` got at once
        (accepted, or its error) lies between the two. Returns (first, end) positions of that stretch."""
        start = len(self.frames)
        name = f"{MARKER}{next(self.markers)}"
        await self.send(frame)
        await self.send(self.marker.frame(name))
        end = await self.wait_for(lambda _, f: self.marker.answers(f, name), start)
        return start, end

    async def close(self) -> None:
        await self.connection.close()
        await self.reader


def answers(frames: list[dict]) -> list[dict]:
    """The frames that answer a websocket API frame at once (accepted, and errors other than a marker's)."""
    return [f for f in frames if f["type"] == "accepted"
            or (f["type"] == "error" and not str(f.get("request_id")).startswith(MARKER))]


# Errors that answer a frame naming a request_id (a reused id, a cancel, a frame of another type, a
# refused start) without being that request's end.
ANSWERS_TO_OTHER_FRAMES = ("duplicate_request_id", "unknown_request_id", "unknown_type", "rate_limited")


def request_frames(frames: list[dict], request_id: str, accepted_at: int) -> tuple[list[dict], int | None]:
    """The frames of the request accepted at position `accepted_at`, through its done or error, and the
    position of that end (None: not yet). A request_id names one request at a time on a socket: the
    next with that id is accepted after this one's end."""
    mine = []
    for at in range(accepted_at + 1, len(frames)):
        frame = frames[at]
        if frame.get("request_id") != request_id or frame["type"] == "accepted":
            continue
        if frame["type"] == "error" and frame["code"] in ANSWERS_TO_OTHER_FRAMES:
            continue  # answers to later frames naming it, not its own end
        mine.append(frame)
        if frame["type"] in ("done", "error"):
            return mine, at
    return mine, None


def check_stream(frames: list[dict], expected: list[int] | None = None) -> None:
    """A request's frames: deltas whose offsets add up, one `done`; with `expected` (its solo run), the
    tokens are it (finish_reason length) or a prefix of it (canceled)."""
    assert frames and frames[-1]["type"] == "done", frames[-1:]
    deltas = [f for f in frames if f["type"] == "delta"]
    assert [d["index"] for d in deltas] == [sum(len(d["token_ids"]) for d in deltas[:i])
                                            for i in range(len(deltas))], deltas
    got = [t for d in deltas for t in d["token_ids"]]
    if expected is not None:
        if frames[-1]["finish_reason"] == "canceled":
            assert got == expected[:len(got)], (got, expected)
        else:
            assert frames[-1]["finish_reason"] == "length" and got == expected, (frames[-1], got, expected)
