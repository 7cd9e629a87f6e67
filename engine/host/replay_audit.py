"""The replay audit: finished requests re-run alone while the engine is idle, compared bit for bit.

A host feeds every finished live request to `offer`; a share of them (ARC_REPLAY_AUDIT_PERMILLE, per
thousand) and any an operator picked join a bounded queue. Whenever the engine holds no live request,
`tick` adds the next one back to it under a prefix-cache scope of the audit's own (no user's blocks
are found, and none of the audit's are found by a user); when a live request arrives while an audit
runs, the audit is aborted and put back at the head of the queue, so it costs live traffic at most
the one step already under way. A re-run's output is never offered again (the audit does not audit
itself). The comparison is the record's (engine/reproduce.py): on a bit-invariant route a difference
is a leak event (REPLAY_MISMATCH) naming the first differing token with both outputs; elsewhere the
logprob distance is reported instead.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.decode.leak_events import REPLAY_MISMATCH, LeakEventLog
from engine.outputs import RequestOutput
from engine.reproduce import Comparison, ReproRecord, compare
from engine.sampling_params import SamplingParams

# The prefix-cache scope of every re-run: no user's name can be it (it starts with a NUL).
AUDIT_SCOPE = "\x00replay-audit"
AUDIT_PREFIX = "replay-audit-"
QUEUE_LIMIT = 256  # audits waiting; past it the oldest is dropped (and counted), never live work delayed
RECENT_LIMIT = 256  # finished requests an operator may still pick by id
SHOWN_TOKENS = 64  # of each output in a leak event's message


@dataclass
class AuditSettings:
    """What ARC_REPLAY_AUDIT_PERMILLE sets (engine/host/runtime_flags.py applies it between steps)."""
    permille: int = 10


class _Live(Protocol):
    @property
    def request_id(self) -> str: ...


class AuditedEngine(Protocol):
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival: float | None = None, cache_scope: str = "") -> None: ...

    def abort(self, request_id: str, by_operator: bool = False) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...

    def live_sequences(self) -> Sequence[_Live]: ...


@dataclass(frozen=True)
class _Job:
    request_id: str
    record: ReproRecord


class ReplayAudit:
    def __init__(self, settings: AuditSettings, events: LeakEventLog, rng: random.Random | None = None) -> None:
        """`events`: the engine's leak event log, where a mismatch is recorded."""
        self.settings, self._events = settings, events
        self._rng = rng or random.Random()
        self._queue: deque[_Job] = deque()
        self._recent: deque[_Job] = deque(maxlen=RECENT_LIMIT)
        self._picked: set[str] = set()
        self._running: tuple[str, _Job] | None = None  # (the re-run's engine id, its job)
        self._yielded: set[str] = set()  # re-runs aborted for live work: their ending is not a result
        self._numbers = itertools.count(1)
        self.audited = self.equal = self.mismatched = self.differed = self.dropped = 0
        self.last_distance = 0.0

    @property
    def waiting(self) -> bool:
        return bool(self._queue) and self._running is None

    def counts(self) -> dict[str, int]:
        return {"replay_audited": self.audited, "replay_audit_equal": self.equal,
                "replay_audit_mismatched": self.mismatched, "replay_audit_differed": self.differed,
                "replay_audit_dropped": self.dropped}

    def pick(self, request_id: str) -> bool:
        """An operator's pick: audited when it finishes, or now if it finished lately. False: unknown."""
        for job in self._recent:
            if job.request_id == request_id:
                self._enqueue(job)
                return True
        self._picked.add(request_id)
        return False

    def owns(self, request_id: str) -> bool:
        return request_id.startswith(AUDIT_PREFIX)

    def offer(self, output: RequestOutput) -> None:
        """A live request's last output: queued for a re-run if it is drawn or was picked."""
        if output.record is None or self.owns(output.request_id):
            return
        job = _Job(output.request_id, output.record)
        self._recent.append(job)
        picked = output.request_id in self._picked
        self._picked.discard(output.request_id)
        if picked or self._rng.random() * 1000 < self.settings.permille:
            self._enqueue(job)

    def _enqueue(self, job: _Job) -> None:
        if len(self._queue) >= QUEUE_LIMIT:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(job)

    def tick(self, engine: AuditedEngine) -> None:
        """Between steps, after the host took in what arrived: yield to live work, or use the idle engine."""
        if self._running is not None:
            rerun_id, job = self._running
            if any(seq.request_id != rerun_id for seq in engine.live_sequences()):
                engine.abort(rerun_id)
                self._yielded.add(rerun_id)
                self._queue.appendleft(job)
                self._running = None
            return
        if not self._queue or engine.has_unfinished_requests():
            return
        job = self._queue.popleft()
        rerun_id = f"{AUDIT_PREFIX}{next(self._numbers)}"
        try:
            engine.add_request(rerun_id, job.record.prompt_ids, job.record.sampling_params(), cache_scope=AUDIT_SCOPE)
        except Exception as exc:  # a record the engine now refuses (another model): counted, never retried
            self._events.record(REPLAY_MISMATCH, f"{job.request_id}: the audit could not re-run it: {exc}")
            self.audited += 1
            self.mismatched += 1
            return
        self._running = (rerun_id, job)

    def observe(self, output: RequestOutput) -> Comparison | None:
        """A re-run's output; at its end the comparison (None while it runs, or when it yielded)."""
        if not output.finished:
            return None
        if output.request_id in self._yielded:
            self._yielded.discard(output.request_id)
            return None
        if self._running is None or self._running[0] != output.request_id:
            return None
        job = self._running[1]
        self._running = None
        if output.record is None:  # the re-run itself failed: its own error says why
            return None
        return self._judge(job, output.record)

    def _judge(self, job: _Job, rerun: ReproRecord) -> Comparison:
        result = compare(job.record, rerun)
        self.audited += 1
        if result.distance is not None:
            self.last_distance = result.distance
        if result.identical:
            self.equal += 1
        elif not job.record.identity.invariant or job.record.identity != rerun.identity:
            self.differed += 1  # a route that promises no bits: its distance is the figure
        else:
            self.mismatched += 1
            recorded, again = job.record.output_ids, rerun.output_ids
            # The leak event log keeps text: both outputs go into the message, up to SHOWN_TOKENS each.
            self._events.record(REPLAY_MISMATCH, (
                f"{job.request_id}: re-run alone differs at output token {result.index} "
                f"(recorded {result.recorded_token}, alone {result.rerun_token}); "
                f"recorded {recorded[:SHOWN_TOKENS]}, alone {again[:SHOWN_TOKENS]}"))
        return result
