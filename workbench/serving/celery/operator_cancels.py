"""OperatorCancels: an operator's cancel sent to the Celery worker that holds the request, and the worker's
answer awaited.

The dashboard shows what the workers' heartbeats list, a second or more behind on a busy host, so a
request an operator cancels may have finished by the time the cancel reaches its engine. The worker
answers `cancel_done` (wire.py) once its engine has applied the cancel, saying whether it still held the
request, and the operator and the audit log hear which. It lives on the link loop, which owns the
channel layer: only that loop runs it.
"""

from __future__ import annotations

import asyncio
import uuid

from workbench.serving.celery import wire
from workbench.serving.celery.redis_layer import OneTripChannelLayer
from workbench.serving.transport import CANCEL_ANSWER_S, FINISHED_FIRST


class OperatorCancels:
    def __init__(self, loop: asyncio.AbstractEventLoop, layer: OneTripChannelLayer, queue_prefix: str) -> None:
        self._loop, self._layer, self._prefix = loop, layer, queue_prefix
        self._answers: dict[str, asyncio.Future[bool]] = {}  # ask id -> whether the engine still held it

    async def cancel(self, worker_id: str, request_id: str, reply_channel: str) -> str | None:
        """Cancel `request_id` on `worker_id`: None once its engine has, else why not."""
        ask_id = uuid.uuid4().hex
        answer = self._answers[ask_id] = self._loop.create_future()
        try:
            try:
                await self._layer.send(wire.control_channel(self._prefix, worker_id),
                                       wire.operator_cancel_message(request_id, ask_id, reply_channel))
            except Exception as exc:  # Redis away: the operator hears it, the dashboard lives on
                return f"the cancel could not reach {worker_id}: {type(exc).__name__}: {exc}"
            try:
                held = await asyncio.wait_for(answer, CANCEL_ANSWER_S)
            except asyncio.TimeoutError:
                return f"sent; no answer within {CANCEL_ANSWER_S:.0f} s (unconfirmed: it may still end canceled)"
        finally:
            del self._answers[ask_id]
        return None if held else FINISHED_FIRST

    def answered(self, message: dict) -> None:
        """A worker's `cancel_done`, as it came on the reply channel."""
        ask_id, held = message.get("ask_id"), message.get("held")
        answer = self._answers.get(ask_id) if isinstance(ask_id, str) else None
        if answer is not None and not answer.done() and isinstance(held, bool):
            answer.set_result(held)
