"""Where a request's costly input work runs: templating, tokenizing and compiling a response_format of a
large request (a long conversation, a 250 KB prompt, a wide JSON schema), done before it is submitted.

Not on the event loop, which every socket and request of the web process shares, and not on as many
threads as there are such requests: on a 2-core machine six threads tokenizing a flood took the cores
from the engine's own thread, and every user's first token waited (bench/noisy_neighbour.py). So large
inputs queue for one thread of their own, one core at most, and small ones, whose work is a fraction of
a millisecond, run where they arrive, never behind a flood of large ones.

That thread is shared by every user, so each user gets a share of it (workbench/serving/input_share.py):
a user whose large requests used more than WORKBENCH_USER_INPUT_SHARE of its time over the last window,
or who has WORKBENCH_USER_INPUT_QUEUE of them waiting already, is refused (`rate_limited`, limits.Refused)
before any more of their work is done, and their flood costs the others at most that share of a core.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from workbench.serving import input_share

T = TypeVar("T")

# Requests from this size (bytes of JSON) on count as large; a chat turn or a short prompt is far below.
LARGE_BYTES = 16 * 1024

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="input-work")


async def prepared(size: int, user: str, work: Callable[..., T], *args: object) -> T:
    """work(*args) for `user`: on the input thread, within the user's share of it, when the request is
    `size` bytes or more (limits.Refused when the share is spent), else here."""
    if size < LARGE_BYTES:
        return work(*args)
    input_share.SHARES.take_turn(user)  # raises limits.Refused
    try:
        return await asyncio.get_running_loop().run_in_executor(_executor, functools.partial(_timed, user, work, *args))
    finally:
        input_share.SHARES.leave(user)


def _timed(user: str, work: Callable[..., T], *args: object) -> T:
    started = time.monotonic()
    try:
        return work(*args)
    finally:
        input_share.SHARES.spent(user, time.monotonic() - started)
