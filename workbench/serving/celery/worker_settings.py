"""WorkerSettings: what a Celery GPU worker reads of the WORKBENCH_* settings, read once at its start.

The worker host and its parts take these values at construction rather than reading Django's settings
inside their methods (the web side's LinkSettings does the same for the transport), so a test can build
a worker with any values and nothing deep in the worker reaches for global state.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class WorkerSettings:
    redis_url: str
    queue_prefix: str  # WORKBENCH_QUEUE_PREFIX: this deployment's queues, channels and presence keys
    heartbeat_s: float  # WORKBENCH_HEARTBEAT_S: how often the worker says it is alive
    lost_after_s: float  # WORKBENCH_WORKER_LOST_S: silence after which a worker or web process counts as lost
    drain_s: float  # WORKBENCH_DRAIN_S: how long a warm shutdown lets held requests finish
    capacity: int  # WORKBENCH_WORKER_CAPACITY: requests it takes at once, as its heartbeat tells the web side
    stream_interval: int  # WORKBENCH_STREAM_INTERVAL: tokens per delta
    stream_gap_s: float  # WORKBENCH_STREAM_GAP_S: longest wait before a partial delta goes out

    @classmethod
    def from_django(cls) -> WorkerSettings:
        return cls(redis_url=settings.REDIS_URL, queue_prefix=settings.WORKBENCH_QUEUE_PREFIX,
                   heartbeat_s=settings.WORKBENCH_HEARTBEAT_S, lost_after_s=settings.WORKBENCH_WORKER_LOST_S,
                   drain_s=settings.WORKBENCH_DRAIN_S, capacity=settings.WORKBENCH_WORKER_CAPACITY,
                   stream_interval=settings.WORKBENCH_STREAM_INTERVAL, stream_gap_s=settings.WORKBENCH_STREAM_GAP_S)
