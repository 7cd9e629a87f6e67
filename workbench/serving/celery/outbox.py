"""A worker's outbox: engine outputs waiting to go back to the web processes, coalesced.

The engine thread pushes every delta; the worker's link loop takes everything pending in one go and
sends one message per web process. While a send is in flight (or Redis is away), new deltas of a
request merge into its pending delta, which keeps its starting offset: a slow link costs one growing
delta per request, never a backlog, and order within a request is kept.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from workbench.serving.streams import StreamEvent


class Outbox:
    def __init__(self, wake: Callable[[], object]) -> None:
        self._wake = wake  # called (from any thread) when a reply channel gets something to send
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, StreamEvent]] = {}  # reply channel -> request id -> delta
        self._failing_since: dict[str, float] = {}  # reply channel -> first failed send

    def sink(self, reply_channel: str, request_id: str) -> "OutboxSink":
        return OutboxSink(self, reply_channel, request_id)

    def push_many(self, events: list[tuple[str, str, StreamEvent]]) -> None:
        """(reply channel, request id, delta) for each: a whole engine step's deltas with one wake-up."""
        wake = False
        with self._lock:
            for reply_channel, request_id, event in events:
                wake = wake or reply_channel not in self._pending
                waiting = self._pending.setdefault(reply_channel, {})
                if request_id in waiting:
                    waiting[request_id].merge(event)
                else:
                    waiting[request_id] = event
        # One wake-up per batch: the link takes every channel pending then. (A channel that is pending
        # already was put back after a failed send, or is not taken yet: that wake-up covers it.)
        if wake:
            self._wake()

    def take(self) -> dict[str, dict[str, StreamEvent]]:
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def sent(self, reply_channel: str) -> None:
        self._failing_since.pop(reply_channel, None)

    def put_back(self, reply_channel: str, events: dict[str, StreamEvent]) -> float:
        """A send failed: its deltas go back in front of anything newer. Returns how long this reply
        channel has been failing, in seconds."""
        with self._lock:
            newer = self._pending.get(reply_channel, {})
            for request_id, event in newer.items():
                if request_id in events:
                    events[request_id].merge(event)
                else:
                    events[request_id] = event
            self._pending[reply_channel] = events
        first = self._failing_since.setdefault(reply_channel, time.monotonic())
        return time.monotonic() - first

    def discard(self, reply_channel: str) -> None:
        """Give up on a reply channel (its web process is gone): drop what waits for it."""
        with self._lock:
            self._pending.pop(reply_channel, None)
        self._failing_since.pop(reply_channel, None)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._pending)


class OutboxSink:
    """One request's sink for the engine thread (workbench.serving.streams.GroupedSink: the sinks of
    one outbox take an engine step's deltas in one push). It stamps each delta's character offset, so
    the web side can tell a repeat from a gap in the text too."""

    def __init__(self, outbox: Outbox, reply_channel: str, request_id: str) -> None:
        self.outbox, self.reply_channel, self.request_id = outbox, reply_channel, request_id
        self.group = outbox
        self.chars = 0

    def stamped(self, event: StreamEvent) -> tuple[str, str, StreamEvent]:
        event.text_offset = self.chars
        self.chars += len(event.text)
        return self.reply_channel, self.request_id, event

    def push_threadsafe(self, event: StreamEvent) -> None:
        self.outbox.push_many([self.stamped(event)])

    def push_group(self, batch: list[tuple["OutboxSink", StreamEvent]]) -> None:
        self.outbox.push_many([sink.stamped(event) for sink, event in batch])
