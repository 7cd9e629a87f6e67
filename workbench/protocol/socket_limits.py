"""What one user may hold open and one socket may send: open sockets per user (WORKBENCH_USER_SOCKETS)
and frames per second per socket (WORKBENCH_SOCKET_FRAMES_PER_S), both counted in this web process.

Every frame costs at least a database query (workbench/protocol/socket_access.py), and every socket a
consumer, so without these one user could make the process do both as fast as a network allows. A frame
over the socket's budget is answered `too_many_frames` and goes no further (no query); a socket over the
user's count is accepted only to be told `too_many_sockets` and closed with TOO_MANY_SOCKETS_CLOSE.
With several web processes each counts its own: a user may hold the limit in each.
"""

from __future__ import annotations

import time
import weakref
from collections import defaultdict

from django.conf import settings

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


# The open sockets of each user in this process. Weak: a consumer that is gone (however its socket
# ended) counts no more, even if its disconnect never ran.
_open: defaultdict[object, weakref.WeakSet[object]] = defaultdict(weakref.WeakSet)


def open_socket(user_key: object, consumer: object) -> bool:
    """Counts `consumer` as one of the user's open sockets; False (and not counted) when the user holds
    WORKBENCH_USER_SOCKETS already."""
    held = _open[user_key]
    limit = settings.WORKBENCH_USER_SOCKETS
    if limit and len(held) >= limit:
        return False
    held.add(consumer)
    return True


def close_socket(user_key: object, consumer: object) -> None:
    held = _open.get(user_key)
    if held is not None:
        held.discard(consumer)
        if not held:
            del _open[user_key]
