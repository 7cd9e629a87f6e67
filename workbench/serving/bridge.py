"""The serving bridge's entry point: which transport serves this process, created on first use.

Nothing heavy happens at import or in AppConfig.ready() (which runs for every management command):
the engine starts the first time a request needs it.
"""

from __future__ import annotations

import threading

from django.conf import settings

from engine import Engine, EngineConfig
from workbench.serving.inprocess import EngineThread

_lock = threading.Lock()
_transport: EngineThread | None = None


def transport() -> EngineThread:
    global _transport
    with _lock:
        if _transport is None:
            config = EngineConfig(model=settings.WORKBENCH_MODEL, device=settings.WORKBENCH_DEVICE,
                                  dtype=settings.WORKBENCH_DTYPE)
            started = EngineThread(lambda: Engine(config))
            started.start()
            _transport = started
        return _transport


def shutdown() -> None:
    """Stop the engine thread (tests, and processes that want a clean exit)."""
    global _transport
    with _lock:
        if _transport is not None:
            _transport.stop()
            _transport = None
