"""The serving bridge: the one door from the web side to the engine, whichever transport is behind it.

Both transports implement one interface, `Transport` (transport.py): `submit(request_id, prompt,
params, user="") -> RequestStream` (from an event loop), `cancel(request_id)`, `tokenizer`,
`tokenizer_for(model)`, `models()`, `running_request_ids()`, `answering()`, `start()`, `stop()`, and for operators `change_flag`,
`cancel_as_operator`, `flags_in_force()`, `metrics_by_worker()`, `watch_state()`, `workers_view()`.
WORKBENCH_TRANSPORT picks one: "inprocess" (InProcessTransport, the engine on a thread of this process) or "celery"
(CeleryTransport, GPU workers over Redis).
Nothing heavy happens at import or in AppConfig.ready() (which runs for every management command):
the transport starts the first time a request needs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from typing import Callable

from django.conf import settings

from workbench.serving import limits
from workbench.serving.transport import Transport

log = logging.getLogger(__name__)

_lock = threading.Lock()
# One transport per kind, created on first use. A deployment only ever uses the kind its setting
# names; the tests flip the setting to run the same test against both.
_transports: dict[str, Transport] = {}
# Called with each transport once it has started (the ops app records engine events from it); a
# listener may return a function that stops what it started, called before the transport stops.
started_listeners: list[Callable[[Transport], Callable[[], None] | None]] = []
_stoppers: list[Callable[[], None]] = []


def _inprocess() -> Transport:
    from engine import Engine
    from workbench.serving.engine_host import EngineHost
    from workbench.serving.engine_settings import served_engine_config
    from workbench.serving.inprocess import InProcessTransport

    config = served_engine_config()
    return InProcessTransport(EngineHost(lambda: Engine(config), settings.WORKBENCH_STREAM_INTERVAL,
                                         settings.WORKBENCH_STREAM_GAP_S), config.model)


def _celery() -> Transport:
    from workbench.serving.celery.link_settings import LinkSettings
    from workbench.serving.celery.transport import CeleryTransport

    return CeleryTransport(LinkSettings.from_django())


def transport() -> Transport:
    kind = settings.WORKBENCH_TRANSPORT
    with _lock:
        if kind not in _transports:
            # Started in a context of its own: what the start schedules (the Celery link loop's tasks,
            # which deliver every request's events) would otherwise run for the process's life in a copy
            # of the first request's context, asgiref's executor of that request's sync frame included,
            # and database work from there fails once that request is over.
            contextvars.Context().run(_start, kind)
        return _transports[kind]


def _start(kind: str) -> None:
    started = _celery() if kind == "celery" else _inprocess()
    started.start()
    _transports[kind] = started
    for listener in started_listeners:
        try:
            stopper = listener(started)
        except Exception:  # a companion (the event recorder) failing must not stop the serving
            log.exception("a transport listener failed")
            continue
        if stopper is not None:
            _stoppers.append(stopper)


def running() -> Transport | None:
    """This process's transport if something has started it, else None (starts nothing)."""
    return _transports.get(settings.WORKBENCH_TRANSPORT)


async def transport_from_loop() -> Transport:
    """transport() for an event loop: the started one at once; starting it blocks, so that on a thread.
    (A thread hop on every request was measurable under load: the loop waits for a pool thread to run.)"""
    started = running()
    return started if started is not None else await asyncio.to_thread(transport)


def shutdown() -> None:
    """Stop the transports (tests, and processes that want a clean exit); the next use starts anew."""
    with _lock:
        while _stoppers:
            try:
                _stoppers.pop()()
            except Exception:
                log.exception("stopping a transport's companion failed")
        while _transports:
            kind, stopping = _transports.popitem()
            try:
                stopping.stop()
            except Exception:  # the others must still stop, and the next use must start afresh
                log.exception("stopping the %s transport failed", kind)
        limits.LIMITER.reset()  # the requests the counts stood for went with the transports
