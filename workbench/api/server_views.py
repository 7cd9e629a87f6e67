"""The server's own state for load balancers and tools, as vLLM's server answers it: GET /health and
GET /version, without authentication.

/health is 200 {"status": "ok"} while an engine takes requests (Transport.answering: the in-process
engine loaded and its thread running; with Celery, a live worker that is not draining) and 503
otherwise: {"status": "starting"}, or {"status": "unavailable"} (no engine answers, or the last start
failed). It never waits: the probe reads what the transport last saw. The engine starts on first use,
so a server nothing has used yet has none, and a load balancer that waits for a 200 before sending
traffic would wait forever. The first probe therefore starts the transport in the background (one
start at a time) and answers "starting" until it serves, as vLLM's /health turns 200 once its engine
has loaded.
"""

from __future__ import annotations

import logging
import threading
from importlib.metadata import PackageNotFoundError, version as package_version

from django.http import HttpRequest, HttpResponse, JsonResponse

from workbench.api.http_api import ApiError
from workbench.serving import bridge

log = logging.getLogger(__name__)

PACKAGE = "workbench"  # pyproject.toml's [project] name


class _BackgroundStart:
    """Starts this process's transport off the event loop, once at a time, for a probe that must not wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.failed = False  # the last start raised: the probes say "unavailable" while the next one tries

    def kick(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._start, name="transport-start", daemon=True)
                self._thread.start()

    def _start(self) -> None:
        try:
            bridge.transport()
        except Exception:
            log.exception("starting the transport for /health failed; the next probe tries again")
            self.failed = True
        else:
            self.failed = False


_background = _BackgroundStart()


def _only_get(request: HttpRequest) -> HttpResponse | None:
    return None if request.method in ("GET", "HEAD") else ApiError(405, "use GET").response()


async def health(request: HttpRequest) -> HttpResponse:
    if (refused := _only_get(request)) is not None:
        return refused
    transport = bridge.running()
    if transport is None:
        _background.kick()
        return JsonResponse({"status": "unavailable" if _background.failed else "starting"}, status=503)
    if not transport.answering():
        return JsonResponse({"status": "unavailable"}, status=503)
    return JsonResponse({"status": "ok"})


async def version(request: HttpRequest) -> HttpResponse:
    if (refused := _only_get(request)) is not None:
        return refused
    return JsonResponse({"version": installed_version()})


def installed_version() -> str:
    """The installed workbench package's version (also Ollama's /api/version answer)."""
    try:
        return package_version(PACKAGE)
    except PackageNotFoundError:  # run from a checkout that was never installed (make and the image install it)
        return "unknown"
