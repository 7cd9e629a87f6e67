"""Where a request's costly input work runs: templating, tokenizing and compiling a response_format of a
large request (a long conversation, a 250 KB prompt, a wide JSON schema), done before it is submitted.

Not on the event loop, which every socket and request of the web process shares, and not on as many
threads as there are such requests: on a 2-core machine six threads tokenizing a flood took the cores
from the engine's own thread, and every user's first token waited (bench/noisy_neighbour.py). So large
inputs queue for one thread of their own, one core at most, and small ones, whose work is a fraction of
a millisecond, run where they arrive, never behind a flood of large ones.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Requests from this size (bytes of JSON) on count as large; a chat turn or a short prompt is far below.
LARGE_BYTES = 16 * 1024

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="input-work")


async def prepared(size: int, work: Callable[..., T], *args: object) -> T:
    """work(*args), on the input thread when the request is `size` bytes or more, else here."""
    if size < LARGE_BYTES:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(_executor, functools.partial(work, *args))
