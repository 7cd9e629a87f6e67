"""Who is alive, in Redis: the workers' heartbeats and the web processes' presence.

A worker writes its heartbeat (device, model, load, the requests it holds, its inspection snapshot for
the dashboard) every WORKBENCH_HEARTBEAT_S, and sooner when the requests it holds change,
under a key that expires after WORKBENCH_WORKER_LOST_S, so a worker killed without a word disappears
by itself. A web process marks its reply channel the same way, so a worker can drop the requests of a
web process that died instead of generating for nobody. Both sides use plain redis-py: these keys are
read far more often than they change, and Celery's own worker events carry none of this.

The snapshot's list of live sequences grows with the load (about 270 bytes a sequence), so a worker
sends it only while a web process says a dashboard is open (WATCHED_KEY, refreshed while one is), and
otherwise only their count.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from workbench.serving.metrics import MetricsSnapshot
from workbench.serving.transport import EngineState

import redis
import redis.asyncio as aioredis

WORKER_KEY = "{prefix}:worker:{worker_id}"
WEB_KEY = "{prefix}:web:{reply_channel}"
ADMITTED_KEY = "{prefix}:admitted:{request_id}"
WATCHED_KEY = "{prefix}:dashboard-watched"
# Long past any redelivery: Celery drops a task older than wire.TASK_EXPIRES_S unrun.
ADMITTED_MEMORY_S = 600


@dataclass
class Heartbeat:
    worker_id: str
    queue: str
    hostname: str
    pid: int
    device: str
    model: str
    capacity: int
    started_at: float
    running: int = 0
    waiting: int = 0
    requests: list[str] = field(default_factory=list)
    flags: dict = field(default_factory=dict)
    draining: bool = False  # shutting down: finishing what it holds, taking nothing new
    metrics: MetricsSnapshot | dict[str, object] = field(default_factory=dict)  # {} before the engine's first
    engine_run: str = ""  # the engine's start (EngineHost.engine_run): names its recorded events
    state: EngineState = field(default_factory=lambda: EngineState())
    sent_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> "Heartbeat":
        data = json.loads(raw)
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def beat(client: redis.Redis, prefix: str, ttl_ms: int, heartbeat: Heartbeat) -> bool:
    """Publish a worker's heartbeat, expiring after `ttl_ms`; returns whether a dashboard is open
    anywhere (one round trip for both). Synchronous: the worker's heartbeat thread calls it
    (heartbeat.py), on no event loop that anything else could hold up."""
    heartbeat.sent_at = time.time()
    with client.pipeline(transaction=False) as pipe:
        pipe.set(WORKER_KEY.format(prefix=prefix, worker_id=heartbeat.worker_id), heartbeat.to_json(), px=ttl_ms)
        pipe.exists(WATCHED_KEY.format(prefix=prefix))
        _, watched = pipe.execute()
    return bool(watched)


def retire(client: redis.Redis, prefix: str, worker_id: str) -> None:
    """A worker shutting down deletes its heartbeat: the web side drops it at its next poll."""
    client.delete(WORKER_KEY.format(prefix=prefix, worker_id=worker_id))


class Presence:
    """The Redis side of presence for a web process (and a worker's look at the web processes), on
    its own event loop."""

    def __init__(self, redis_url: str, prefix: str, lost_after_s: float) -> None:
        self.redis = aioredis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        self.prefix = prefix
        self.ttl_ms = int(lost_after_s * 1000)

    async def watch(self) -> None:
        """A dashboard is open in this web process: workers send their sequence lists for lost_after_s."""
        await self.redis.set(WATCHED_KEY.format(prefix=self.prefix), "1", px=self.ttl_ms)

    async def workers(self) -> dict[str, Heartbeat]:
        keys = [key async for key in self.redis.scan_iter(match=WORKER_KEY.format(prefix=self.prefix, worker_id="*"))]
        values = await self.redis.mget(keys) if keys else []
        beats = (Heartbeat.from_json(raw) for raw in values if raw is not None)
        return {beat.worker_id: beat for beat in beats}

    async def mark_web(self, reply_channel: str) -> None:
        await self.redis.set(WEB_KEY.format(prefix=self.prefix, reply_channel=reply_channel), "1", px=self.ttl_ms)

    async def webs_alive(self, reply_channels: list[str]) -> set[str]:
        keys = [WEB_KEY.format(prefix=self.prefix, reply_channel=c) for c in reply_channels]
        values = await self.redis.mget(keys) if keys else []
        return {channel for channel, value in zip(reply_channels, values) if value is not None}

    async def close(self) -> None:
        await self.redis.aclose()


def admit_once(client: redis.Redis, prefix: str, request_ids: list[str], worker_id: str) -> list[bool]:
    """For each request id, True the first time it is admitted anywhere; a redelivered task gets False.
    One round trip for all of a task's requests. Synchronous: the Celery task calls it on its own
    thread, with no hop to an event loop on the way."""
    with client.pipeline(transaction=False) as pipe:
        for request_id in request_ids:
            key = ADMITTED_KEY.format(prefix=prefix, request_id=request_id)
            pipe.set(key, worker_id, nx=True, ex=ADMITTED_MEMORY_S)
        return [bool(answer) for answer in pipe.execute()]
