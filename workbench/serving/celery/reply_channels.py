"""ReplyChannels: a worker's table of the requests its engine holds, each with the reply channel of the
web process that sent it, so the link loop knows whom a request's deltas go to, which web processes to
watch for, and whose requests to cancel when one is gone.

Written by the Celery task's thread (admit) and the link loop; a lock keeps the two apart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class ReplyChannels:
    def __init__(self) -> None:
        self._reply_of: dict[str, str] = {}  # request id -> reply channel, while the engine holds it
        self._lock = threading.Lock()

    def hold(self, request_id: str, reply_channel: str) -> None:
        with self._lock:
            self._reply_of[request_id] = reply_channel

    def finished(self, request_ids: Iterable[str]) -> None:
        """Requests whose last delta went out."""
        with self._lock:
            for request_id in request_ids:
                self._reply_of.pop(request_id, None)

    def channels(self) -> list[str]:
        """The web processes with a request here, each once."""
        with self._lock:
            return sorted(set(self._reply_of.values()))

    def forget_channel(self, reply_channel: str) -> list[str]:
        """The requests of `reply_channel`, forgotten here; the caller cancels them."""
        with self._lock:
            orphans = [rid for rid, channel in self._reply_of.items() if channel == reply_channel]
            for request_id in orphans:
                del self._reply_of[request_id]
        return orphans
