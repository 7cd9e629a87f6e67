"""Roster: the GPU workers as the Celery transport's last poll of their heartbeats saw them, and the
choices made from it: which take requests now, and the least loaded of those.

The link loop replaces the table whole at each poll (`update`); other threads (the consumers' loop,
the dashboard) only read it, through the views below, which take one reference to it first.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import cast

from workbench.serving.celery.presence import Heartbeat
from workbench.serving.metrics import MetricsSnapshot
from workbench.serving.transport import Flags, WorkerView


class Roster:
    def __init__(self, heartbeat_s: float, lost_after_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.lost_after_s = lost_after_s
        self.workers: dict[str, Heartbeat] = {}  # as of the last successful poll
        self._beat_changed: dict[str, tuple[float, float]] = {}  # worker -> (its sent_at, when it changed)
        self._polled_at = 0.0

    def update(self, workers: dict[str, Heartbeat]) -> None:
        """A poll's heartbeats: each one that moved since the last poll is stamped with this process's clock."""
        now = self._polled_at = time.monotonic()
        for worker_id, beat in workers.items():
            if self._beat_changed.get(worker_id, (None,))[0] != beat.sent_at:
                self._beat_changed[worker_id] = (beat.sent_at, now)
        self._beat_changed = {w: seen for w, seen in self._beat_changed.items() if w in workers}
        self.workers = workers

    def poll_failed(self) -> None:
        if time.monotonic() - self._polled_at > self.lost_after_s:
            self.workers = {}  # nothing known for that long: no worker counts as live

    def routable(self) -> list[Heartbeat]:
        """Workers taking requests: not draining, and whose heartbeat moved lately (a worker killed a
        moment ago still has its key in Redis until it expires). Judged by this process's own clock,
        so clock skew between machines cannot make a live worker look stale."""
        now, fresh_for = time.monotonic(), 2.5 * self.heartbeat_s
        return [beat for worker_id, beat in self.workers.items()
                if not beat.draining and now - self._beat_changed.get(worker_id, (0, 0))[1] < fresh_for]

    @staticmethod
    def least_loaded(live: list[Heartbeat], sent_to: Callable[[str], set[str]]) -> Heartbeat | None:
        """The worker holding the fewest requests (those its heartbeat lists and those this process sent
        it since, `sent_to`) below its capacity, chosen at random among equals; None if all are full."""
        def held(beat: Heartbeat) -> int:
            return len(sent_to(beat.worker_id) | set(beat.requests))

        loads = [(held(beat), beat) for beat in live]
        open_loads = [(n, beat) for n, beat in loads if n < beat.capacity]
        if not open_loads:
            return None
        least = min(n for n, _ in open_loads)
        return random.choice([beat for n, beat in open_loads if n == least])

    def held_wire_ids(self) -> set[str]:
        return {wire_id for beat in list(self.workers.values()) for wire_id in beat.requests}

    def flags_in_force(self) -> dict[str, Flags]:
        return {worker_id: beat.flags for worker_id, beat in self.workers.items()}

    def metrics_by_worker(self) -> dict[str, MetricsSnapshot]:
        # A heartbeat's metrics are its engine's MetricsSnapshot, or {} before the first.
        return {worker_id: cast(MetricsSnapshot, beat.metrics) for worker_id, beat in self.workers.items()
                if beat.metrics}

    def view(self) -> dict[str, WorkerView]:
        """The dashboard's view of each live worker, from its last heartbeat."""
        now = time.time()
        return {worker_id: {"device": beat.device, "model": beat.model, "engine_run": beat.engine_run,
                            "running": beat.running, "waiting": beat.waiting, "draining": beat.draining,
                            "heartbeat_age_s": round(max(0.0, now - beat.sent_at)),  # whole s: fewer frames
                            "flags": beat.flags, "state": beat.state}
                for worker_id, beat in sorted(self.workers.items())}
