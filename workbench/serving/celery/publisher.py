"""Publisher: the Celery transport's requests to each worker, sent as Celery tasks one task at a time.

What arrives while a task is on its way goes in the next. Requests come in bursts (a wave of replies
ends in one engine step and its clients answer together), and a task costs ~0.5-0.9 ms of CPU here and
more on the worker, one after another (docs/BENCHMARKS_ARCHIVE.md): with one task per request, the burst's last
waited. It lives on the link loop: only that loop calls it.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from workbench.celery import app as celery_app
from workbench.serving.celery import wire
from workbench.serving.celery.pending import PendingRequests
from workbench.serving.celery.presence import Heartbeat

log = logging.getLogger(__name__)


class Publisher:
    def __init__(self, loop: asyncio.AbstractEventLoop, pending: PendingRequests) -> None:
        self._loop = loop
        self._pending = pending
        self._outgoing: dict[str, list[dict]] = {}  # worker id -> requests waiting for the next task to it
        self._publishing: set[str] = set()  # workers with a task on its way

    def send(self, worker: Heartbeat, request: dict, reply_channel: str) -> None:
        """Queue `request` (its wire form) for `worker`, and start its sending unless a task is on its way."""
        self._outgoing.setdefault(worker.worker_id, []).append(request)
        if worker.worker_id not in self._publishing:
            self._publishing.add(worker.worker_id)
            self._loop.create_task(self._publish(worker, reply_channel))

    async def _publish(self, worker: Heartbeat, reply_channel: str) -> None:
        try:
            while batch := [r for r in self._outgoing.pop(worker.worker_id, []) if r["request_id"] in self._pending]:
                ids = [r["request_id"] for r in batch]
                # argsrepr: what Celery shows of a task's arguments in its headers, and so in its logs,
                # events and monitors (Flower). Left to Celery it holds the prompts; a user's
                # conversation is not for them.
                send = partial(celery_app.send_task, wire.GENERATE_TASK, args=[batch, reply_channel],
                               argsrepr=f"[{ids!r} (prompts withheld)]", kwargsrepr="{}",
                               queue=worker.queue, expires=wire.TASK_EXPIRES_S, retry=False)
                try:
                    await self._loop.run_in_executor(None, send)
                except Exception as exc:
                    log.warning("could not send %s to %s: %s", ids, worker.worker_id, exc)
                    for wire_id in ids:
                        self._pending.fail(wire_id, "unavailable",
                                           "the request could not reach a GPU worker (is Redis up?)")
        finally:
            self._publishing.discard(worker.worker_id)
