"""LinkSettings: what the Celery transport's web side reads of the WORKBENCH_* settings, read once.

The transport and its parts (pending.py, flag_fanout.py) take these values at construction rather
than reading Django's settings inside their methods, so a test can build one with any values and
nothing deep in the link reaches for global state.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class LinkSettings:
    model: str  # WORKBENCH_MODEL: the model a request that names none goes to, and the tokenizer preloaded
    redis_url: str
    queue_prefix: str  # WORKBENCH_QUEUE_PREFIX: the Redis keys of this deployment's presence
    heartbeat_s: float  # WORKBENCH_HEARTBEAT_S: how often workers beat, and so how often the link polls
    lost_after_s: float  # WORKBENCH_WORKER_LOST_S: silence after which a worker (or a request) counts as lost

    @classmethod
    def from_django(cls) -> LinkSettings:
        return cls(model=settings.WORKBENCH_MODEL, redis_url=settings.REDIS_URL,
                   queue_prefix=settings.WORKBENCH_QUEUE_PREFIX, heartbeat_s=settings.WORKBENCH_HEARTBEAT_S,
                   lost_after_s=settings.WORKBENCH_WORKER_LOST_S)
