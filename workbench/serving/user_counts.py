"""A user's request counts, behind one interface: how many requests they have under way and how many they
started in the last minute. Two implementations: MemoryUserCounts (one web process: the in-process
transport) and RedisUserCounts (workbench/serving/celery/redis_counts.py: every web process of a
deployment on the Celery transport, over its Redis).

`acquire` checks both limits and takes a slot in one atomic step, and answers with what it found; the
refusal's wording is workbench/serving/limits.py's, the same for both.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Protocol

WINDOW_S = 60.0  # the rate limit's window: requests started in the last minute


@dataclass(frozen=True)
class Lease:
    """One request's slot among its user's concurrent requests, held until released (or, in Redis,
    until it expires unrenewed: its web process died)."""
    user: str
    id: str


@dataclass(frozen=True)
class Busy:
    """Refused: the user holds `held` requests, the concurrency limit."""
    held: int


@dataclass(frozen=True)
class TooFrequent:
    """Refused: the user started the rate limit's requests in the window; the oldest leaves it in `wait_s`."""
    wait_s: float


class UserCounts(Protocol):
    def acquire(self, user: str, concurrent: int, per_minute: int) -> Lease | Busy | TooFrequent:
        """A slot for one more request of `user`, counted as a start, or why not (0 turns a limit off)."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the slot back (the start stays counted in its window). Releasing twice is harmless."""
        ...

    def in_flight(self, user: str) -> int:
        ...

    def reset(self) -> None:
        """Forget the slots this process holds: the transports stopped, and the requests with them."""
        ...


def new_lease(user: str) -> Lease:
    return Lease(user, uuid.uuid4().hex)


class MemoryUserCounts:
    """The counts of this process, under a lock: the views and consumers share one event loop, but
    tests and management commands may admit from others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, set[str]] = defaultdict(set)
        self._starts: dict[str, deque[float]] = defaultdict(deque)

    def acquire(self, user: str, concurrent: int, per_minute: int) -> Lease | Busy | TooFrequent:
        now = time.monotonic()
        with self._lock:
            held = self._held[user]
            if concurrent and len(held) >= concurrent:
                return Busy(len(held))
            starts = self._starts[user]
            while starts and now - starts[0] >= WINDOW_S:
                starts.popleft()
            if per_minute and len(starts) >= per_minute:
                return TooFrequent(WINDOW_S - (now - starts[0]))
            starts.append(now)
            lease = new_lease(user)
            held.add(lease.id)
            return lease

    def release(self, lease: Lease) -> None:
        with self._lock:
            held = self._held.get(lease.user)
            if held is not None:
                held.discard(lease.id)
                if not held:
                    del self._held[lease.user]

    def in_flight(self, user: str) -> int:
        with self._lock:
            return len(self._held.get(user, ()))

    def reset(self) -> None:
        with self._lock:
            self._held.clear()
            self._starts.clear()
