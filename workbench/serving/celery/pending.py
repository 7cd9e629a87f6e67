"""PendingRequests: the Celery transport's table of the requests this web process has sent and not seen end.

Each entry is keyed by its wire id (the request id plus a random suffix: a client may reuse a request
id once its request is over, and the workers' run-once guard and any late delta of the earlier request
must not mistake one for the other) and holds the request's stream, its worker, and its in-order check
(sequencing.py). The table relays each delta to its stream, sends cancels (with retries) to the
owning worker's control channel, and ends a request with an error when it fails here or its worker is
lost, so no client hangs. It lives on the link loop: only that loop changes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from workbench.serving.celery import wire
from workbench.serving.celery.presence import Heartbeat
from workbench.serving.celery.redis_layer import OneTripChannelLayer
from workbench.serving.celery.sequencing import DeliveryGap, InOrder
from workbench.serving.streams import RequestStream, StreamEvent

log = logging.getLogger(__name__)
CANCEL_ATTEMPTS = 5


@dataclass
class _Pending:
    request_id: str
    stream: RequestStream
    worker_id: str
    confirmed_at: float  # last time the worker was seen holding it, or a delta of it arrived
    order: InOrder = field(default_factory=InOrder)


class PendingRequests:
    def __init__(self, loop: asyncio.AbstractEventLoop, layer: OneTripChannelLayer, queue_prefix: str) -> None:
        """`loop`: the link loop, which runs the cancels; `layer`: the channel layer they go out on, to
        the workers' control channels under `queue_prefix`."""
        self._loop, self._layer, self._prefix = loop, layer, queue_prefix
        self._by_wire_id: dict[str, _Pending] = {}
        self._wire_ids: dict[str, str] = {}  # request id -> wire id, while pending

    def add(self, request_id: str, stream: RequestStream, worker_id: str) -> str:
        """Register a request sent to `worker_id`; returns the wire id it travels under."""
        wire_id = f"{request_id}.{uuid.uuid4().hex[:12]}"
        self._by_wire_id[wire_id] = _Pending(request_id, stream, worker_id, time.monotonic())
        self._wire_ids[request_id] = wire_id
        return wire_id

    def __contains__(self, wire_id: str) -> bool:
        return wire_id in self._by_wire_id

    def sent_to(self, worker_id: str) -> set[str]:
        """The wire ids of the requests pending on `worker_id`."""
        return {w for w, p in self._by_wire_id.items() if p.worker_id == worker_id}

    def request_ids(self) -> dict[str, str]:
        """Wire id -> request id of every pending request (a copy: readable from another thread)."""
        return {w: p.request_id for w, p in list(self._by_wire_id.items())}

    def cancel_request(self, request_id: str) -> None:
        wire_id = self._wire_ids.get(request_id)
        if wire_id is not None:
            self._cancel(wire_id)

    def _cancel(self, wire_id: str) -> None:
        pending = self._by_wire_id.get(wire_id)
        if pending is not None:
            self._loop.create_task(self._send_cancel(pending.worker_id, wire_id))

    async def _send_cancel(self, worker_id: str, wire_id: str) -> None:
        """A few tries: a cancel that cannot get through leaves a worker generating for nobody."""
        for attempt in range(CANCEL_ATTEMPTS):
            try:
                await self._layer.send(wire.control_channel(self._prefix, worker_id), wire.cancel_message(wire_id))
                return
            except Exception as exc:
                log.warning("could not cancel %s on %s (try %d): %s", wire_id, worker_id, attempt + 1, exc)
                await asyncio.sleep(0.5 * (attempt + 1))

    def fail(self, wire_id: str, code: str, message: str) -> None:
        """End a request here with an error, and tell its worker to stop (if it can still hear)."""
        self._cancel(wire_id)
        pending = self._by_wire_id.pop(wire_id, None)
        if pending is not None:
            self._wire_ids.pop(pending.request_id, None)
            pending.stream.push_threadsafe(StreamEvent.failure(code, message))

    def relay(self, wire_id: str, event: StreamEvent) -> tuple[RequestStream, StreamEvent] | None:
        """What of `event` is new, in order, for its request's stream (None: nothing to pass on)."""
        pending = self._by_wire_id.get(wire_id)
        if pending is None:
            return None  # ended here already (lost, or failed to send); its worker has been told or is gone
        try:
            fresh = pending.order.accept(event)
        except DeliveryGap as exc:
            self.fail(wire_id, "delivery_gap", str(exc))
            return None
        pending.confirmed_at = time.monotonic()
        if fresh is None:
            return None
        if fresh.finished:
            del self._by_wire_id[wire_id]
            self._wire_ids.pop(pending.request_id, None)
        return pending.stream, fresh

    def watch(self, workers: Mapping[str, Heartbeat]) -> None:
        """After a fresh poll: confirm the requests their worker holds; end those whose worker is gone."""
        now = time.monotonic()
        for wire_id, pending in list(self._by_wire_id.items()):
            worker = workers.get(pending.worker_id)
            if worker is not None and wire_id in worker.requests:
                pending.confirmed_at = now
            elif worker is None and now - pending.confirmed_at > 1.0:
                self.fail(wire_id, "worker_lost", "the GPU worker serving this request stopped; "
                                                  "its output so far is kept")

    def watch_silence(self, lost_after_s: float) -> None:
        """End the requests nothing has confirmed for `lost_after_s` (Redis away, or a task that never ran)."""
        now = time.monotonic()
        for wire_id, pending in list(self._by_wire_id.items()):
            if now - pending.confirmed_at > lost_after_s:
                self.fail(wire_id, "worker_lost", "the GPU worker serving this request stopped answering")
