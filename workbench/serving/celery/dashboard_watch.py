"""DashboardWatch: how many operator dashboards of this web process are open. While any is, the GPU
workers include their sequence lists in their heartbeats (the one part of the inspection that grows
with the load); they learn it from a mark in Redis (Presence.watch) that the transport's poll renews.

Counted from any thread; the mark is written on the link loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from workbench.serving.celery.presence import Presence

log = logging.getLogger(__name__)


class DashboardWatch:
    def __init__(self, loop: asyncio.AbstractEventLoop, presence: Presence) -> None:
        self._loop = loop
        self._presence = presence
        self._dashboards = 0
        self._lock = threading.Lock()

    @property
    def watched(self) -> bool:
        return self._dashboards > 0

    def watch(self) -> Callable[[], None]:
        """A dashboard opens: the workers send their sequence lists (within one heartbeat) until the
        returned unwatch is called for every watch and the Redis mark expires."""
        with self._lock:
            self._dashboards += 1
            first = self._dashboards == 1
        if first:  # say so now, not at the next poll
            asyncio.run_coroutine_threadsafe(self._mark(), self._loop)
        unwatched = threading.Event()

        def unwatch() -> None:
            if not unwatched.is_set():
                unwatched.set()
                with self._lock:
                    self._dashboards -= 1

        return unwatch

    async def _mark(self) -> None:
        try:
            await self._presence.watch()
        except Exception as exc:  # the next poll tries again
            log.warning("presence: %s: %s", type(exc).__name__, exc)
