"""Request limits: per user (concurrent requests, requests a minute), per web process (requests in
flight, the bound on every transport's queue) and per request (a queue-wait and a whole-request timeout).

Every path that submits a generation (the websocket API, the chat, the OpenAI API) asks `admit(user)`
first and submits through the Admission it gets, which watches the request's stream:
- `admit` refuses with Refused: `rate_limited` (the user holds WORKBENCH_USER_CONCURRENT_REQUESTS
  requests, or started WORKBENCH_USER_REQUESTS_PER_MINUTE in the last 60 s) or `overloaded` (this
  process holds WORKBENCH_MAX_IN_FLIGHT requests); each says when to try again (`retry_after`, seconds).
- a request whose first output has not come within WORKBENCH_QUEUE_TIMEOUT_S, or that runs past
  WORKBENCH_REQUEST_TIMEOUT_S, is canceled in the engine and its stream ends with a `timeout` error.
A request counts from its admission until its stream's last event (done, canceled, error, timeout), so
a canceled or disconnected one counts until the engine has really let it go.

The counts live in this web process: with several Daphne instances each counts its own users, so a user
may reach the limits once per instance (docs/OPERATIONS.md). Settings are read at each admission, so a
test (or an operator's settings override) takes effect at once. 0 turns a limit off.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

from django.conf import settings

from engine import SamplingParams
from workbench.serving.streams import RequestStream, StreamEvent
from workbench.serving.transport import Transport

WINDOW_S = 60.0  # the rate limit's window: requests started in the last minute
# What a refusal for concurrency or load suggests: such a slot frees when any request ends.
RETRY_SOON_S = 1


class Refused(Exception):
    """A request refused before it was submitted: its error code, message and when to try again."""

    def __init__(self, code: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after


class Limiter:
    """The counts of one web process. Locked: the views and consumers of a process share one event
    loop, but tests and management commands may admit from others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = defaultdict(int)
        self._starts: dict[str, deque[float]] = defaultdict(deque)
        self.total = 0

    def admit(self, user: str) -> Admission:
        concurrent, per_minute = settings.WORKBENCH_USER_CONCURRENT_REQUESTS, settings.WORKBENCH_USER_REQUESTS_PER_MINUTE
        bound = settings.WORKBENCH_MAX_IN_FLIGHT
        now = time.monotonic()
        with self._lock:
            if bound and self.total >= bound:
                raise Refused("overloaded", f"the server holds {self.total} requests, its limit "
                                            "(WORKBENCH_MAX_IN_FLIGHT); try again shortly", RETRY_SOON_S)
            if concurrent and self._in_flight[user] >= concurrent:
                raise Refused("rate_limited", f"you have {self._in_flight[user]} requests under way, the most one "
                                              "user may (WORKBENCH_USER_CONCURRENT_REQUESTS); wait for one to end",
                              RETRY_SOON_S)
            starts = self._starts[user]
            while starts and now - starts[0] >= WINDOW_S:
                starts.popleft()
            if per_minute and len(starts) >= per_minute:
                wait = max(1, math.ceil(WINDOW_S - (now - starts[0])))
                raise Refused("rate_limited", f"at most {per_minute} requests a minute per user "
                                              f"(WORKBENCH_USER_REQUESTS_PER_MINUTE); try again in {wait} s", wait)
            starts.append(now)
            self._in_flight[user] += 1
            self.total += 1
        return Admission(self, user)

    def in_flight(self, user: str) -> int:
        with self._lock:
            return self._in_flight.get(user, 0)

    def _release(self, user: str) -> None:
        with self._lock:
            if self._in_flight.get(user, 0) > 0:
                self._in_flight[user] -= 1
                self.total -= 1
            if not self._in_flight.get(user):
                self._in_flight.pop(user, None)

    def reset(self) -> None:
        """Forget every count: the transports stopped, and with them every request they held."""
        with self._lock:
            self._in_flight.clear()
            self._starts.clear()
            self.total = 0


class Admission:
    """One admitted request's place in the counts, held until its stream ends (or release())."""

    def __init__(self, limiter: Limiter, user: str) -> None:
        self._limiter, self.user, self.released = limiter, user, False

    def release(self) -> None:
        """Idempotent: the stream's end and a path that never submitted may both call it."""
        if not self.released:
            self.released = True
            self._limiter._release(self.user)

    def submit(self, transport: Transport, request_id: str, prompt: str | list[int],
               params: SamplingParams, model: str = "") -> RequestStream:
        """transport.submit, from an event loop, with the request's timeouts and its release attached."""
        try:
            stream = transport.submit(request_id, prompt, params, user=self.user, model=model)
        except BaseException:
            self.release()
            raise
        _Deadlines(stream, self, lambda: transport.cancel(request_id))
        return stream


class _Deadlines:
    """Watches one stream (on its loop): the first output stops the queue-wait timer, the last event
    stops both and releases the admission; a timer that fires cancels the request and ends the stream."""

    def __init__(self, stream: RequestStream, admission: Admission, cancel: Callable[[], None]) -> None:
        self.stream, self.admission, self.cancel = stream, admission, cancel
        queue_s, request_s = settings.WORKBENCH_QUEUE_TIMEOUT_S, settings.WORKBENCH_REQUEST_TIMEOUT_S
        loop = stream.loop
        self.queue_timer = loop.call_later(queue_s, self._expire, (
            f"no output within {queue_s:g} s of its arrival (WORKBENCH_QUEUE_TIMEOUT_S): the server is busy; "
            "try again later")) if queue_s else None
        self.request_timer = loop.call_later(request_s, self._expire, (
            f"the request ran past {request_s:g} s (WORKBENCH_REQUEST_TIMEOUT_S) and was stopped")) if request_s else None
        stream.on_push = self._seen

    def _seen(self, event: StreamEvent) -> None:
        if self.queue_timer is not None:
            self.queue_timer.cancel()
            self.queue_timer = None
        if event.finished:
            if self.request_timer is not None:
                self.request_timer.cancel()
                self.request_timer = None
            self.admission.release()

    def _expire(self, message: str) -> None:
        self.cancel()  # the engine lets it go at its next step; its own last event is dropped
        self.stream.push(StreamEvent.failure("timeout", message))


LIMITER = Limiter()


def admit(user: str) -> Admission:
    """This process's admission of a request for `user` (Refused when a limit says no)."""
    return LIMITER.admit(user)


def admit_all(user: str, n: int) -> list[Admission]:
    """Admissions for a request of `n` choices (each is an engine sequence, so each counts toward the
    limits): all of them, or Refused with none held."""
    admissions: list[Admission] = []
    try:
        for _ in range(n):
            admissions.append(LIMITER.admit(user))
        return admissions
    except Refused:
        for admission in admissions:
            admission.release()
        raise
