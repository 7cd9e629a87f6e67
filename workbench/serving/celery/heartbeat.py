"""A Celery worker's heartbeat, written by a thread of its own with a Redis connection of its own.

Nothing the engine does can hold it back: not a long step (a prefill, a graph capture, a stalled device
sync), not the link loop's work (deliveries, cancels, flag answers), not a wait for a step boundary.
Only the GIL is shared with the engine thread, and the engine's long work (torch ops, our native
kernels) runs without it; Python work on the engine thread gives the GIL up every switch interval
(5 ms). So a live worker's key is rewritten every WORKBENCH_HEARTBEAT_S, and sooner when what it holds
changes, whatever its engine is doing; one that is gone stops rewriting it. What the web side makes of
that (the grace periods) is in docs/OPERATIONS.md, "Worker liveness".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from workbench.serving.celery.presence import Heartbeat, beat, retire

log = logging.getLogger(__name__)

EARLY_BEAT_S = 0.2  # the soonest a heartbeat follows the last one when the requests held changed


class HeartbeatThread:
    def __init__(self, redis_url: str, prefix: str, every_s: float, lost_after_s: float,
                 compose: Callable[[], Heartbeat], held: Callable[[], list[str]],
                 on_watched: Callable[[bool], None], after_first: Callable[[], None]) -> None:
        """`compose`: this moment's heartbeat (it must not wait for the engine); `held`: the requests
        held now, as the heartbeat lists them (asked every EARLY_BEAT_S); `on_watched`: told after
        each beat whether a dashboard is open anywhere; `after_first`: run once, on a thread of its own,
        after the first beat that reached Redis (it may wait for the engine: the beats go on meanwhile)."""
        self._client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        self._prefix, self._every_s, self._ttl_ms = prefix, every_s, int(lost_after_s * 1000)
        self._compose, self._held, self._on_watched, self._after_first = compose, held, on_watched, after_first
        self._soon = threading.Event()
        self._soon_at: float | None = None  # a beat asked for later (beat_soon with a delay)
        self._soon_lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)
        self.beats = 0  # written to Redis so far

    def start(self) -> None:
        self._thread.start()

    def beat_soon(self, delay_s: float = 0.0) -> None:
        """A heartbeat now (a drain, a flag change), or within `delay_s`; from any thread."""
        if delay_s <= 0:
            self._soon.set()
            return
        with self._soon_lock:
            at = time.monotonic() + delay_s
            self._soon_at = at if self._soon_at is None else min(self._soon_at, at)

    def stop(self, retire_worker: str | None = None) -> None:
        """No more beats; with `retire_worker`, delete its key too, so the web side drops it at once."""
        self._stopped.set()
        self._soon.set()
        self._thread.join(timeout=5)
        if retire_worker is not None:
            try:
                retire(self._client, self._prefix, retire_worker)
            except redis.RedisError as exc:  # its key expires by itself
                log.warning("could not retire %s: %s", retire_worker, exc)
        self._client.close()

    def _run(self) -> None:
        first = True
        sent: list[str] = []
        while not self._stopped.is_set():
            try:
                heartbeat = self._compose()
                sent = heartbeat.requests
                watched = beat(self._client, self._prefix, self._ttl_ms, heartbeat)
                self.beats += 1
                self._on_watched(watched)
                if first:
                    first = False
                    threading.Thread(target=self._after_first, name="worker-first-beat", daemon=True).start()
            except redis.RedisError as exc:  # Redis away: the next period tries again
                log.warning("heartbeat: %s: %s", type(exc).__name__, exc)
            except Exception:  # a thread that died here would make a live worker look dead
                log.exception("heartbeat failed; trying again at the next period")
            self._until_next_beat(sent)

    def _until_next_beat(self, sent_requests: list[str]) -> None:
        """A period, cut short when asked (beat_soon) and within EARLY_BEAT_S when the requests held
        changed (the dashboard shows sequences come and go; routing sees the load sooner)."""
        deadline = time.monotonic() + self._every_s
        while (left := deadline - time.monotonic()) > 0 and not self._stopped.is_set():
            with self._soon_lock:
                if self._soon_at is not None and time.monotonic() >= self._soon_at:
                    self._soon_at = None
                    return
                wait = min(left, EARLY_BEAT_S) if self._soon_at is None else \
                    min(left, EARLY_BEAT_S, max(0.0, self._soon_at - time.monotonic()))
            if self._soon.wait(wait):
                self._soon.clear()
                return
            if self._held() != sent_requests:
                return
