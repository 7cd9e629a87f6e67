"""RequestStream: one request's outputs, handed from the engine thread to an asyncio consumer.

Deltas are coalesced: while the consumer is busy, new deltas merge into one pending delta (text and
token ids appended, the first index kept), so a slow reader costs one growing delta, never a queue
that grows without bound, and every delta still says at which token offset it starts.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, cast


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
    # Per token of `token_ids` when the request asks for logprobs: [token_id, logprob, [[id, logprob],
    # ...the top N]], plain lists so that they travel through msgpack as they are.
    logprobs: list[list] | None = None
    # On the last event of a request that ran to its end: its reproducibility record (engine/reproduce.py,
    # ReproRecord.as_dict()), which the web side keeps with the reply.
    reproduce: dict | None = None
    # On a request's first delta when it asks for prompt logprobs: per prompt token [token_id, logprob,
    # [[id, logprob], ...]], the first token's logprob null (nothing precedes it).
    prompt_logprobs: list[list] | None = None

    @classmethod
    def failure(cls, code: str, message: str) -> "StreamEvent":
        return cls(finished=True, finish_reason="error", error_code=code, error=message)

    def merge(self, later: "StreamEvent") -> None:
        """Append a later delta of the same request: this one keeps its index (where it starts)."""
        self.text += later.text
        self.token_ids += later.token_ids
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.prompt_logprobs = self.prompt_logprobs or later.prompt_logprobs
        self.finished, self.finish_reason = later.finished, later.finish_reason
        self.usage, self.timings = later.usage or self.usage, later.timings or self.timings
        self.error_code, self.error = later.error_code or self.error_code, later.error or self.error
        self.reproduce = later.reproduce or self.reproduce

    def as_message(self) -> dict:
        """A plain dict for the channel layer (msgpack) between a worker and a web process. Shallow:
        it is serialized at once; dataclasses.asdict's deep copy was 12% of a worker's link thread."""
        return dict(vars(self))

    @classmethod
    def from_message(cls, message: dict) -> "StreamEvent":
        return cls(**{name: message[name] for name in cls.__dataclass_fields__ if name in message})


class Sink(Protocol):
    def push_threadsafe(self, event: StreamEvent) -> None: ...


class GroupedSink(Sink, Protocol):
    """A sink whose events can travel with others': sinks with the same `group` take a whole engine
    step's events in one `push_group` call (on any one of them), so that one step costs one wake-up of
    whoever sends them on, not one per request."""
    group: object

    def push_group(self, batch: list[tuple["GroupedSink", StreamEvent]]) -> None: ...


def deliver(deliveries: Iterable[tuple[Sink, StreamEvent]]) -> None:
    """Hand each event to its sink, from another thread, one call per group of sinks (GroupedSink).
    Each call_soon_threadsafe writes to a loop's self-pipe, and one write per request per engine step
    was measured at 6% of the engine thread with 32 clients; a worker's outbox woken per request sent
    a step's deltas to a web process as four messages instead of one (docs/BENCHMARKS_ARCHIVE.md)."""
    groups: dict[object, list[tuple[GroupedSink, StreamEvent]]] = defaultdict(list)
    for sink, event in deliveries:
        group = getattr(sink, "group", None)
        if group is None:
            sink.push_threadsafe(event)
        else:
            groups[group].append((cast(GroupedSink, sink), event))  # a sink with a group is one
    for batch in groups.values():
        batch[0][0].push_group(batch)


def _push_all(batch: list[tuple["RequestStream", StreamEvent]]) -> None:
    for stream, event in batch:
        stream.push(event)


class RequestStream:
    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self._pending: StreamEvent | None = None
        self._ready = asyncio.Event()
        self.closed = False
        # Told of each event the stream takes, on its loop (the request's limits watch it: limits.py).
        self.on_push: Callable[[StreamEvent], None] | None = None

    @property
    def group(self) -> asyncio.AbstractEventLoop:
        """The streams of one event loop take a step's events in one wake-up of it."""
        return self.loop

    def push_group(self, batch: list[tuple["RequestStream", StreamEvent]]) -> None:
        self.loop.call_soon_threadsafe(_push_all, batch)

    def push_threadsafe(self, event: StreamEvent) -> None:
        """Called from another thread (the engine's, or the Celery link's); `deliver` groups these."""
        self.loop.call_soon_threadsafe(self.push, event)

    def push(self, event: StreamEvent) -> None:
        """On the stream's own loop."""
        if self.closed or (self._pending is not None and self._pending.finished):
            return  # nothing follows a request's last event (a late duplicate error, say)
        if self.on_push is not None:
            self.on_push(event)
        if self._pending is None:
            self._pending = event
        else:
            self._pending.merge(event)
        self._ready.set()

    async def next(self) -> StreamEvent:
        """Everything that arrived since the last call, as one event."""
        await self._ready.wait()
        event, self._pending = self._pending, None
        assert event is not None  # _ready is set only with an event pending
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
