"""OneTripChannelLayer: channels-redis's layer with a one-round-trip send and a batch receive.

The Celery transport's hops between web processes and workers (wire.py) run on this layer. It keeps
channels-redis's storage exactly, so either side may be a plain RedisChannelLayer: a channel is a
sorted set at `prefix + non_local_name(channel)` whose members are serialized messages scored by
`time.time()`, expired below `now - expiry`, refused at `get_capacity(channel)`, and a process-specific
channel ("...!...") carries its full name inside the message under `__asgi_channel__`.

It depends on these channels-redis internals (RedisChannelLayer, channels-redis 4.2 and 4.3), which
tests/workbench/test_redis_layer.py pins by name and signature together with the version range in
pyproject.toml (tests/workbench/test_delivery.py checks the storage against a plain layer):
- methods `require_valid_channel_name(name, receive=False)`, `non_local_name(name)`,
  `consistent_hash(value)`, `connection(index)` (a redis.asyncio client), `serialize(message)`,
  `deserialize(message)`, `get_capacity(channel)`;
- attributes `prefix`, `expiry`, `brpop_timeout`, and the private `_send_index_generator` (the cycle
  of host indexes a general channel's send takes the next of).
"""

from __future__ import annotations

import logging
import time

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

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
    trips cost a third of a millisecond of its CPU each time (docs/BENCHMARKS_ARCHIVE.md)."""

    async def send(self, channel: str, message: dict[str, object]) -> None:
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

    async def receive_batch(self, channel: str, limit: int = 256) -> list[dict[str, object]]:
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
        messages: list[dict[str, object]] = []
        for member, _score in popped:
            try:
                message = self.deserialize(member)
            except Exception:  # one undecodable message must not cost the others taken with it
                log.exception("undecodable message on %s skipped", channel)
                continue
            if message.pop("__asgi_channel__", channel) == channel:  # another channel of ours: none exists
                messages.append(message)
        return messages


# redis-py (8.x) reads every reply within 5 s by default, the same 5 s that a blocking pop waits on the
# server (brpop_timeout). A pop whose message came just before its wait ended, or whose reply sat
# unread while a busy event loop was elsewhere, then times out on the client after Redis has removed
# the message: that message is lost. The client waits well past the server's longest wait instead.
SOCKET_TIMEOUT_S = 30


def make_layer(redis_url: str) -> OneTripChannelLayer:
    """A channels-redis layer of our own for the transport (the Channels default may be in-memory)."""
    return OneTripChannelLayer(hosts=[{"address": redis_url, "socket_timeout": SOCKET_TIMEOUT_S}],
                               capacity=1000, expiry=60)
