"""RequestStream: one request's outputs, handed from the engine thread to an asyncio consumer.

Deltas are coalesced: while the consumer is busy, new deltas merge into one pending delta (text and
token ids appended, the first index kept), so a slow reader costs one growing delta, never a queue
that grows without bound, and every delta still says at which token offset it starts.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field


@dataclass
class StreamEvent:
    """What a consumer receives: a delta, possibly the last one (finished), or an error."""
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None
    error_code: str | None = None
    error: str | None = None
    text_offset: int = 0  # where `text` starts in the whole reply (stamped by a worker's outbox)

    @classmethod
    def failure(cls, code: str, message: str) -> "StreamEvent":
        return cls(finished=True, finish_reason="error", error_code=code, error=message)

    def merge(self, later: "StreamEvent") -> None:
        """Append a later delta of the same request: this one keeps its index (where it starts)."""
        self.text += later.text
        self.token_ids += later.token_ids
        self.finished, self.finish_reason = later.finished, later.finish_reason
        self.usage, self.timings = later.usage or self.usage, later.timings or self.timings
        self.error_code, self.error = later.error_code or self.error_code, later.error or self.error

    def as_message(self) -> dict:
        """A plain dict for the channel layer (msgpack) between a worker and a web process."""
        return asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> "StreamEvent":
        return cls(**{name: message[name] for name in cls.__dataclass_fields__ if name in message})


class RequestStream:
    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._loop = loop
        self._pending: StreamEvent | None = None
        self._ready = asyncio.Event()
        self.closed = False

    def push_threadsafe(self, event: StreamEvent) -> None:
        """Called from the engine thread."""
        self._loop.call_soon_threadsafe(self._push, event)

    def _push(self, event: StreamEvent) -> None:
        if self.closed or (self._pending is not None and self._pending.finished):
            return  # nothing follows a request's last event (a late duplicate error, say)
        if self._pending is None:
            self._pending = event
        else:
            self._pending.merge(event)
        self._ready.set()

    async def next(self) -> StreamEvent:
        """Everything that arrived since the last call, as one event."""
        await self._ready.wait()
        event, self._pending = self._pending, None
        self._ready.clear()
        if event.finished:
            self.closed = True
        return event

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamEvent:
        if self.closed:
            raise StopAsyncIteration
        return await self.next()
