"""RequestStream: one request's outputs, handed from the engine thread to an asyncio consumer.

Deltas are coalesced: while the consumer is busy, new deltas merge into one pending delta (text and
token ids appended, the first index kept), so a slow reader costs one growing delta, never a queue
that grows without bound, and every delta still says at which token offset it starts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


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
        if self._pending is None:
            self._pending = event
        else:
            p = self._pending
            p.text += event.text
            p.token_ids += event.token_ids
            p.finished, p.finish_reason = event.finished, event.finish_reason
            p.usage, p.timings = event.usage or p.usage, event.timings or p.timings
            p.error_code, p.error = event.error_code or p.error_code, event.error or p.error
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
