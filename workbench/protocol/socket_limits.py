"""What one user may hold open and one socket may send: open sockets per user (WORKBENCH_USER_SOCKETS)
and frames per second per socket (WORKBENCH_SOCKET_FRAMES_PER_S).

Every frame costs at least a database query (workbench/protocol/socket_access.py), and every socket a
consumer, so without these one user could make the process do both as fast as a network allows. A frame
over the socket's budget is answered `too_many_frames` and goes no further (no query); a socket over the
user's count is accepted only to be told `too_many_sockets` and closed with TOO_MANY_SOCKETS_CLOSE.
Open sockets are counted as requests are (workbench/serving/user_counts.py): with the Celery transport
as leases in Redis that every web process of the deployment shares, renewed while the socket is open and
expiring when a process dies; with the in-process transport in this process. Frames are a socket's own.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable

import redis
from django.conf import settings

from workbench.serving.user_counts import Lease, MemoryUserCounts, UserCounts

log = logging.getLogger(__name__)

TOO_MANY_SOCKETS_CLOSE = 4429


class FrameBudget:
    """A token bucket: WORKBENCH_SOCKET_FRAMES_PER_S frames a second on average, in bursts of up to two
    seconds' worth (a client that sends a batch of requests at once is not refused for it)."""

    def __init__(self) -> None:
        self.rate = settings.WORKBENCH_SOCKET_FRAMES_PER_S
        self.tokens = 2.0 * self.rate
        self.at = time.monotonic()

    def take(self) -> bool:
        """Whether the socket may send this frame now (always, with no limit set)."""
        if not self.rate:
            return True
        now = time.monotonic()
        self.tokens = min(2.0 * self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def wait_s(self) -> float:
        """Seconds until the budget holds a frame again (0: it does now, or there is no limit)."""
        if not self.rate:
            return 0.0
        now = time.monotonic()
        tokens = min(2.0 * self.rate, self.tokens + (now - self.at) * self.rate)
        return max(0.0, (1 - tokens) / self.rate)


# The sockets open in this process, where the in-process transport keeps its counts too.
_memory_counts = MemoryUserCounts()


def _counts() -> UserCounts:
    """Where sockets are counted: in Redis with the Celery transport, beside (not among) the users'
    request counts, so that every web process of the deployment counts the same sockets; else here."""
    if settings.WORKBENCH_TRANSPORT != "celery":
        return _memory_counts
    from workbench.serving.celery.redis_counts import counts_for

    prefix = settings.WORKBENCH_LIMITS_PREFIX or settings.WORKBENCH_QUEUE_PREFIX
    return counts_for(settings.REDIS_URL, f"{prefix}:sockets", settings.WORKBENCH_LIMIT_LEASE_S)


def open_socket(username: str, consumer: object) -> Callable[[], None] | None:
    """Counts `consumer` as one of the user's open sockets and returns what gives its place back (call it
    at the disconnect); None (and not counted) when the user holds WORKBENCH_USER_SOCKETS already. A
    consumer that is gone gives its place back even if its disconnect never ran. Blocking (Redis): call
    it off the event loop. A Redis that does not answer counts nothing (logged), as the sign-in throttles
    do: the socket is let in rather than every socket refused."""
    limit = settings.WORKBENCH_USER_SOCKETS
    if not limit:
        return lambda: None
    counts = _counts()
    try:
        outcome = counts.acquire(username, limit, 0)
    except redis.RedisError as exc:
        log.warning("open sockets cannot be counted (Redis: %s); %s's is let in uncounted", exc, username)
        return lambda: None
    if not isinstance(outcome, Lease):
        return None
    return weakref.finalize(consumer, _release, counts, outcome)


def _release(counts: UserCounts, lease: Lease) -> None:
    try:
        counts.release(lease)
    except redis.RedisError:  # the lease expires unrenewed, as a dead process's would
        pass
