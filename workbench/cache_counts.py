"""Counts over a window that opens at its first event, kept in Django's cache (Redis with the Celery
transport, so every web process counts together; this process's memory otherwise): the sign-in and
sign-up throttles (workbench/accounts/throttle.py) and the tokenize limit (workbench/api/tokenize_limit.py).

A window opened by its first event, not one aligned to the clock: with clock-aligned windows a client
gets twice the allowance across a boundary (its limit just before it, its limit again just after), and a
test that makes its attempts across one sees its count reset. The window's start is kept beside its count
(both expire with the window), so a refusal can say when the window ends.
"""

from __future__ import annotations

import time

from django.core.cache import cache


def _keys(key: str) -> tuple[str, str]:
    return f"{key}:n", f"{key}:since"


def add(key: str, window_s: float) -> int:
    """One more event under `key`; returns the count in its window so far, this one included. Raises
    whatever the cache raises when it cannot be reached."""
    count, since = _keys(key)
    timeout = int(window_s) + 1
    cache.add(since, time.time(), timeout=timeout)
    if cache.add(count, 1, timeout=timeout):
        return 1
    try:
        return int(cache.incr(count))
    except ValueError:  # expired between the add and the incr: this event opens the next window
        cache.set(since, time.time(), timeout=timeout)
        cache.set(count, 1, timeout=timeout)
        return 1


def current(key: str) -> int:
    """The count in `key`'s open window (0 when none is open)."""
    return int(cache.get(_keys(key)[0]) or 0)


def seconds_left(key: str, window_s: float) -> int:
    """Whole seconds until `key`'s window ends (at least 1)."""
    since = cache.get(_keys(key)[1])
    left = window_s if since is None else since + window_s - time.time()
    return max(1, int(left + 0.999))


def clear(key: str) -> None:
    cache.delete_many(list(_keys(key)))
