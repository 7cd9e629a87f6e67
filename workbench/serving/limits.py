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

Where the counts live: a user's counts (concurrent requests, requests a minute) are in Redis whenever
the Celery transport is used, shared by every web process of the deployment, as leases that expire
unless renewed (workbench/serving/celery/redis_counts.py); with the in-process transport they are in
this process's memory (workbench/serving/user_counts.py). The bound on requests in flight is this
process's own in both (it bounds what this process piles onto its engine or the workers). Settings are
read at each admission, so a test (or an operator's settings override) takes effect at once. 0 turns
a limit off.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import redis
from django.conf import settings

from engine import SamplingParams
from workbench.serving.record_keepers import RECORD_KEEPERS, KeptRecord
from workbench.serving.streams import RequestStream, StreamEvent
from workbench.serving.transport import Transport
from workbench.serving.user_counts import Busy, Lease, MemoryUserCounts, TooFrequent, UserCounts

# What a refusal for concurrency or load suggests: such a slot frees when any request ends.
RETRY_SOON_S = 1


class Refused(Exception):
    """A request refused before it was submitted: its error code, message and when to try again."""

    def __init__(self, code: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after


class Limiter:
    """This process's admissions: its own in-flight total, and each user's counts where the transport
    in use keeps them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.memory = MemoryUserCounts()
        self.total = 0

    def counts(self) -> UserCounts:
        """Where users are counted now: Redis for the Celery transport, this process otherwise."""
        if settings.WORKBENCH_TRANSPORT != "celery":
            return self.memory
        from workbench.serving.celery.redis_counts import counts_for

        return counts_for(settings.REDIS_URL, settings.WORKBENCH_LIMITS_PREFIX or settings.WORKBENCH_QUEUE_PREFIX,
                          settings.WORKBENCH_LIMIT_LEASE_S)

    def admit(self, user: str) -> Admission:
        concurrent, per_minute = settings.WORKBENCH_USER_CONCURRENT_REQUESTS, settings.WORKBENCH_USER_REQUESTS_PER_MINUTE
        bound = settings.WORKBENCH_MAX_IN_FLIGHT
        with self._lock:
            if bound and self.total >= bound:
                raise Refused("overloaded", f"the server holds {self.total} requests, its limit "
                                            "(WORKBENCH_MAX_IN_FLIGHT); try again shortly", RETRY_SOON_S)
            self.total += 1  # held while the user's counts are asked, so the bound holds meanwhile
        counts = self.counts()
        try:
            outcome = counts.acquire(user, concurrent, per_minute)
        except redis.RedisError as exc:
            self._release_total()
            raise Refused("unavailable", f"the request limits cannot be counted: Redis does not answer ({exc})",
                          RETRY_SOON_S) from None
        except BaseException:
            self._release_total()
            raise
        if isinstance(outcome, Lease):
            return Admission(self, counts, outcome)
        self._release_total()
        if isinstance(outcome, Busy):
            raise Refused("rate_limited", f"you have {outcome.held} requests under way, the most one "
                                          "user may (WORKBENCH_USER_CONCURRENT_REQUESTS); wait for one to end",
                          RETRY_SOON_S)
        assert isinstance(outcome, TooFrequent)
        wait = max(1, math.ceil(outcome.wait_s))
        raise Refused("rate_limited", f"at most {per_minute} requests a minute per user "
                                      f"(WORKBENCH_USER_REQUESTS_PER_MINUTE); try again in {wait} s", wait)

    def in_flight(self, user: str) -> int:
        return self.counts().in_flight(user)

    def _release_total(self) -> None:
        with self._lock:
            self.total = max(0, self.total - 1)

    def _release(self, counts: UserCounts, lease: Lease) -> None:
        self._release_total()
        try:
            counts.release(lease)
        except redis.RedisError:  # the lease then expires unrenewed, as a dead process's would
            pass

    def reset(self) -> None:
        """Forget every count of this process: the transports stopped, and with them every request they held."""
        with self._lock:
            self.total = 0
        self.memory.reset()
        from workbench.serving.celery.redis_counts import reset_all

        reset_all()


class Admission:
    """One admitted request's place in the counts, held until its stream ends (or release())."""

    def __init__(self, limiter: Limiter, counts: UserCounts, lease: Lease) -> None:
        self._limiter, self._counts, self._lease, self.released = limiter, counts, lease, False
        self.user = lease.user

    def release(self) -> None:
        """Idempotent: the stream's end and a path that never submitted may both call it."""
        if not self.released:
            self.released = True
            self._limiter._release(self._counts, self._lease)

    def submit(self, transport: Transport, request_id: str, prompt: str | list[int],
               params: SamplingParams, model: str = "", keep_record: bool = True) -> RequestStream:
        """transport.submit, from an event loop, with the request's timeouts and its release attached.
        With `keep_record`, its reproducibility record goes to each of RECORD_KEEPERS when it ends."""
        try:
            stream = transport.submit(request_id, prompt, params, user=self.user, model=model)
        except BaseException:
            self.release()
            raise
        kept = KeptRecord(self.user, request_id, model) if keep_record else None
        _Deadlines(stream, self, lambda: transport.cancel(request_id), kept)
        return stream


class _Deadlines:
    """Watches one stream (on its loop): the first output stops the queue-wait timer, the last event
    stops both and releases the admission; a timer that fires cancels the request and ends the stream."""

    def __init__(self, stream: RequestStream, admission: Admission, cancel: Callable[[], None],
                 kept: KeptRecord | None = None) -> None:
        self.stream, self.admission, self.cancel, self.kept = stream, admission, cancel, kept
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
            if self.kept is not None and event.reproduce is not None:
                for keeper in RECORD_KEEPERS:
                    keeper(self.kept, event.reproduce)

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
