"""Waiting for a condition instead of sleeping for it: `wait_until` polls a predicate until it holds
and fails, naming what it waited for, once the deadline passes. A fixed sleep is either too short on a
loaded machine (a flaky failure that names nothing) or too long everywhere else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """predicate()'s first truthy value, polled every `interval` s; AssertionError naming `what` after
    `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
    return value


async def async_wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """`wait_until` for a coroutine: the (blocking) predicate runs on a thread, the loop sleeps between."""
    deadline = time.monotonic() + timeout
    while not (value := await asyncio.to_thread(predicate)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
    return value
