"""Each user's share of the input thread (workbench/serving/input_work.py): the seconds their large
requests' input work took over the last WINDOW_S, and how many of them wait for the thread now.

A user is refused more large input work while either is at its limit:
- WORKBENCH_USER_INPUT_SHARE: the fraction of the window that their work may have taken (0.25: a
  quarter of one core's time, about 27 tokenizations of a 250 KB prompt every 10 s);
- WORKBENCH_USER_INPUT_QUEUE: their requests waiting for or on the thread (without it, a burst sent at
  once would all be queued before the first had been timed).
Both are counted in this web process, whose thread it is. 0 turns one off.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque

from django.conf import settings

from workbench.serving.limits import Refused

WINDOW_S = 10.0


class InputShares:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent: defaultdict[str, deque[tuple[float, float]]] = defaultdict(deque)  # (ended at, seconds)
        self._waiting: defaultdict[str, int] = defaultdict(int)

    def take_turn(self, user: str) -> None:
        """Counts one more of `user`'s requests as waiting for the thread, or raises Refused."""
        with self._lock:
            refused = self._refusal(user)
            if refused is not None:
                raise refused
            self._waiting[user] += 1

    def refusal(self, user: str) -> Refused | None:
        """What take_turn would raise for `user` now, without taking a turn: the websocket door
        (workbench/protocol/frame_door.py) refuses a large frame with it before the frame is read."""
        with self._lock:
            return self._refusal(user)

    def _refusal(self, user: str) -> Refused | None:
        share, queue = settings.WORKBENCH_USER_INPUT_SHARE, settings.WORKBENCH_USER_INPUT_QUEUE
        if queue and self._waiting.get(user, 0) >= queue:
            return Refused("rate_limited", f"you have {queue} large requests waiting to be read already, the "
                                           "most one user may (WORKBENCH_USER_INPUT_QUEUE); wait for one", 1)
        spent, free_in = self._spent_in_window(user, share * WINDOW_S)
        if share and spent >= share * WINDOW_S:
            return Refused("rate_limited", f"your large requests took {spent:.1f} s of reading in the last "
                                           f"{WINDOW_S:.0f} s, the most one user may (WORKBENCH_USER_INPUT_SHARE "
                                           f"{share:g}); try again in {math.ceil(free_in)} s", max(1, math.ceil(free_in)))
        return None

    def leave(self, user: str) -> None:
        with self._lock:
            self._waiting[user] -= 1
            if not self._waiting[user]:
                del self._waiting[user]

    def spent(self, user: str, seconds: float) -> None:
        with self._lock:
            self._spent[user].append((time.monotonic(), seconds))

    def _spent_in_window(self, user: str, allowed: float) -> tuple[float, float]:
        """Under the lock: the user's seconds in the window, and how long until they are under `allowed`."""
        now = time.monotonic()
        entries = self._spent.get(user)
        while entries and entries[0][0] <= now - WINDOW_S:
            entries.popleft()
        if not entries:
            self._spent.pop(user, None)
            return 0.0, 0.0
        total = sum(seconds for _, seconds in entries)
        over, free_in = total - allowed, 0.0
        for ended, seconds in entries:  # the oldest leave the window first
            if over < 0:
                break
            over -= seconds
            free_in = ended + WINDOW_S - now
        return total, free_in


SHARES = InputShares()
