"""What travels between web processes and Celery workers, and on what.

- Requests: a Celery task (`workbench.generate`) on the chosen worker's own queue, `<prefix>.<worker id>`,
  carrying the requests for that worker that reached the web process while the previous task was on its way.
- Tokens back: `events` messages on the channels-redis layer, sent to the web process's reply channel;
  each carries every pending delta of that web process's requests on that worker (coalesced), and each
  delta says at which token offset it starts, so the web side can tell a gap from a late delta.
- Cancel: a `cancel` message on the worker's control channel, `<prefix>.control.<worker id>`. Celery's
  revoke cannot stop a task that already runs, and our task only admits; the engine holds the request.
- Runtime flags: a `set_flag` message on the control channel; the worker answers `flag_done` (the flags
  in force after its next step boundary, or why it refused) on the asking web process's reply channel.
  Changes meant for every worker are also kept in the Redis hash `<prefix>:flags`, which a worker
  applies when it starts.
"""

from __future__ import annotations

import logging
import time

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from redis.exceptions import ResponseError

from workbench.serving.streams import StreamEvent

log = logging.getLogger(__name__)

GENERATE_TASK = "workbench.generate"
EVENTS = "workbench.events"
CANCEL = "workbench.cancel"
SET_FLAG = "workbench.set_flag"
FLAG_DONE = "workbench.flag_done"
# A task not started within this long is dropped by Celery unrun: its client has had an error by then.
TASK_EXPIRES_S = 60


# channels-redis's send, as one script: drop expired messages, refuse when full, add, refresh expiry.
_SEND = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[3])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class OneTripChannelLayer(RedisChannelLayer):
    """channels-redis with `send` in one round trip instead of four (the same keys, scores and
    message format, so its receive is unchanged). A worker sends once per engine step; the four round
    trips cost a third of a millisecond of its CPU each time (docs/BENCHMARKS.md)."""

    async def send(self, channel: str, message: dict) -> None:
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        key_name = channel
        if "!" in channel:  # a process-specific channel: the receiver routes by the full name inside
            message = {**message, "__asgi_channel__": channel}
            key_name = self.non_local_name(channel)
        index = self.consistent_hash(channel) if "!" in channel else next(self._send_index_generator)
        now = time.time()
        added = await self.connection(index).eval(_SEND, 1, self.prefix + key_name, self.serialize(message), now,
                                                  int(now) - int(self.expiry), self.get_capacity(channel),
                                                  int(self.expiry))
        if not added:
            raise ChannelFull()

    has_bzmpop = True  # until Redis says otherwise (before 7.0): then one message per round trip

    async def receive_batch(self, channel: str, limit: int = 256) -> list[dict]:
        """Every message waiting on `channel` (up to `limit`, oldest first), after waiting up to
        brpop_timeout for the first: one round trip (BZMPOP; before Redis 7, BZPOPMIN and one message),
        where channels-redis's receive takes four per message (a cleanup script, BZPOPMIN, and adding
        to and removing from a backup set that keeps a message taken by a receive cancelled midway).
        So only for a process-specific channel whose one receiver lives as long as its process (the
        Celery transport's reply channel): a message taken by a receive cancelled at shutdown goes with
        the process that would have read it. The same keys and message format as channels-redis."""
        assert "!" in channel, "receive_batch is for this process's own channels"
        key = self.prefix + self.non_local_name(channel)
        connection = self.connection(self.consistent_hash(channel))
        if self.has_bzmpop:
            try:
                popped = await connection.bzmpop(self.brpop_timeout, 1, [key], min=True, count=limit)
                popped = popped[1] if popped else []
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self.has_bzmpop = False
        if not self.has_bzmpop:
            first = await connection.bzpopmin(key, timeout=self.brpop_timeout)
            popped = [first[1:]] if first else []
        messages = []
        for member, _score in popped:
            try:
                message = self.deserialize(member)
            except Exception:  # one undecodable message must not cost the others taken with it
                log.exception("undecodable message on %s skipped", channel)
                continue
            if message.pop("__asgi_channel__", channel) == channel:  # another channel of ours: none exists
                messages.append(message)
        return messages


def make_layer() -> RedisChannelLayer:
    """A channels-redis layer of our own for the transport (the Channels default may be in-memory)."""
    return OneTripChannelLayer(hosts=[settings.REDIS_URL], capacity=1000, expiry=60)


def queue_name(worker_id: str) -> str:
    return f"{settings.WORKBENCH_QUEUE_PREFIX}.{worker_id}"


def control_channel(worker_id: str) -> str:
    name = f"{settings.WORKBENCH_QUEUE_PREFIX}.control.{worker_id}"
    if len(name) >= 100:  # Channels refuses longer names on every send and receive
        raise ValueError(f"channel name {name!r} is too long; shorten WORKBENCH_QUEUE_PREFIX")
    return name


def events_message(events: dict[str, StreamEvent]) -> dict:
    return {"type": EVENTS, "events": [{"request_id": rid, **event.as_message()} for rid, event in events.items()]}


def events_of(message: dict) -> list[tuple[str, StreamEvent]]:
    return [(item["request_id"], StreamEvent.from_message(item)) for item in message.get("events", [])]


def cancel_message(request_id: str) -> dict:
    return {"type": CANCEL, "request_id": request_id}


def flags_key() -> str:
    return f"{settings.WORKBENCH_QUEUE_PREFIX}:flags"


def set_flag_message(change_id: str, name: str, value: bool | int, reply_channel: str) -> dict:
    return {"type": SET_FLAG, "change_id": change_id, "name": name, "value": value, "reply_channel": reply_channel}


def flag_done_message(change_id: object, worker_id: str, in_force: dict | None, error: str | None) -> dict:
    """`change_id`: the asking message's, echoed as it came (a garbled one is answered too)."""
    return {"type": FLAG_DONE, "change_id": change_id, "worker_id": worker_id, "in_force": in_force, "error": error}
