"""FlagFanout: an operator's runtime-flag change sent to Celery workers, and their answers gathered.

Each change goes to every asked worker's control channel under a change id of its own; a worker answers
`flag_done` on this web process's reply channel after its next step boundary (wire.py), and the change
returns each worker's answer, or why none came within FLAG_ANSWER_S. A change for every worker is also
kept in Redis, so that a worker that starts later applies it. It lives on the link loop, which owns the
channel layer: only that loop runs it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Collection

from redis.asyncio import Redis

from engine.host.capabilities import capability
from workbench.serving.celery import wire
from workbench.serving.celery.redis_layer import OneTripChannelLayer
from workbench.serving.transport import FLAG_ANSWER_S, FlagAnswer

log = logging.getLogger(__name__)


class FlagFanout:
    def __init__(self, loop: asyncio.AbstractEventLoop, layer: OneTripChannelLayer, redis: Redis,
                 queue_prefix: str) -> None:
        """`loop`: the link loop; `layer`: the channel layer the changes go out on; `redis`: where a
        change for every worker is kept for those that start later; `queue_prefix`: the deployment's
        namespace of both."""
        self._loop, self._layer, self._redis, self._prefix = loop, layer, redis, queue_prefix
        self._answers: dict[str, dict[str, asyncio.Future[FlagAnswer]]] = {}  # change id -> worker -> answer

    async def change(self, name: str, value: bool | int, workers: list[str] | None, live: Collection[str],
                     reply_channel: str) -> dict[str, FlagAnswer]:
        """Ask `workers` (None: every one of `live`, the workers known now, and every worker that starts
        later) to change a flag; answers come back on `reply_channel`, to `answered`."""
        targets = list(live) if workers is None else workers
        answers: dict[str, FlagAnswer] = {w: {"error": "no such worker"} for w in targets if w not in live}
        asked = [w for w in targets if w in live]
        change_id = uuid.uuid4().hex
        waiting = self._answers[change_id] = {w: self._loop.create_future() for w in asked}
        try:
            if workers is None and capability(name).settable:  # a start-only flag is only answered
                try:
                    await self._redis.hset(wire.flags_key(self._prefix), name, json.dumps(value))
                except Exception as exc:
                    log.warning("flag change %s not kept for later workers: %s", change_id, exc)
            for worker_id in asked:
                try:
                    await self._layer.send(wire.control_channel(self._prefix, worker_id),
                                           wire.set_flag_message(change_id, name, value, reply_channel))
                except Exception as exc:  # this one is not reached; the others are still waited for
                    waiting[worker_id].set_result({"error": f"could not reach the worker: {exc}"})
            if waiting:
                await asyncio.wait(waiting.values(), timeout=FLAG_ANSWER_S)
        finally:
            del self._answers[change_id]
        for worker_id, answer in waiting.items():
            answers[worker_id] = answer.result() if answer.done() else \
                {"error": f"no answer within {FLAG_ANSWER_S:.0f} s (unconfirmed: it may still apply)"}
        return answers

    def answered(self, message: dict) -> None:
        """A worker's `flag_done`, as it came on the reply channel."""
        change_id, worker_id = message.get("change_id"), message.get("worker_id")
        if not isinstance(change_id, str) or not isinstance(worker_id, str):
            return  # not an answer to a change asked from here
        answer = self._answers.get(change_id, {}).get(worker_id)
        if answer is not None and not answer.done():
            in_force, error = message.get("in_force"), message.get("error")
            answer.set_result({"in_force": in_force} if error is None else {"error": error})
