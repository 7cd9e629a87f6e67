"""EngineHost: the thread that owns an engine and runs its step loop; the heart of both transports.

The engine is single-threaded by design, so the thread owns it: other threads only enqueue commands
(add, abort, flag), and the thread applies them between steps, steps while any request is unfinished,
and hands each output to its request's sink (a RequestStream for the in-process transport, inprocess.py;
the worker's outbox in a Celery worker, worker.py). A cancel therefore reaches the engine at its next
step. What other threads may read (the requests held, flags, metrics, the inspection snapshot) is
published as one immutable HostSnapshot after each step; the engine is read only through its public
surface (Engine.stats(), snapshot(), apply_flags(), leak_events_since(), flags()), the snapshot turned
into the dashboard's JSON by engine/host/inspection.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, assert_never, cast

from engine import Engine, InvalidSamplingParams, PromptError, RequestError, SamplingParams
from engine.host.inspection import engine_state
from engine.host.replay_audit import ReplayAudit
from engine.loading.tokenizer import Tokenizer, TokenizerError
from engine.outputs import RequestOutput
from workbench.serving import heap
from workbench.serving.metrics import EngineMetrics, MetricsSnapshot
from workbench.serving.stream_interval import DeltaHold
from workbench.serving.streams import Sink, StreamEvent, deliver
from workbench.serving.transport import EngineState, Flags

log = logging.getLogger(__name__)

# A cancel can overtake its request (the Celery task and the cancel travel separately): such a cancel
# is remembered this long, and the request, when it comes, ends canceled without running.
EARLY_CANCEL_MEMORY_S = 120.0
# The inspection snapshot (engine/host/inspection.py) is refreshed at most this often, and at once when a
# request arrives or finishes or a leak event is recorded: the dashboard sees every change that matters
# without the engine paying for a snapshot on every step.
STATE_EVERY_S = 0.1


# Called on the engine thread once a flag change is in force (with the flags now in force), or refused
# (with the reason).
FlagDone = Callable[[Flags | None, str | None], None]
# Called on the engine thread once a cancel is applied: whether the engine still held the request (False:
# it had finished, or never came).
CancelDone = Callable[[bool], None]


@dataclass(frozen=True)
class HostSnapshot:
    """The host's state as of the engine's last step: what it holds, its flags, metrics and inspection,
    read by other threads without touching the engine."""
    running: int = 0
    waiting: int = 0
    request_ids: tuple[str, ...] = ()
    metrics: MetricsSnapshot | None = None
    flags: Flags | None = None  # the runtime flags in force
    state: EngineState | None = None  # for the operator dashboard


# What other threads ask of the engine thread, applied between steps in the order asked.
@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    sink: Sink
    user: str
    arrival: float  # time.monotonic() when it was handed over


@dataclass(frozen=True)
class _Abort:
    request_id: str
    by_operator: bool = False
    done: CancelDone | None = None


@dataclass(frozen=True)
class _AuditPick:
    request_id: str


@dataclass(frozen=True)
class _SetFlag:
    name: str
    value: bool | int
    done: FlagDone


@dataclass(frozen=True)
class _Stop:
    pass


_Command = _Add | _Abort | _AuditPick | _SetFlag | _Stop


class EngineHost:
    def __init__(self, engine_factory: Callable[[], Engine], stream_interval: int = 1,
                 stream_gap_s: float = 0.0) -> None:
        """`stream_interval`, `stream_gap_s`: the tokens a request's deltas gather, and the least time
        between two of them, before they go out (stream_interval.py)."""
        self._factory = engine_factory
        self._hold = DeltaHold(stream_interval, stream_gap_s)
        # The inspection snapshot's per-sequence list, which grows with the load: a Celery worker turns
        # it off while no dashboard watches (its snapshot travels in every heartbeat).
        self.sequences_in_state = True
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._users: dict[str, str] = {}  # request id -> the user it serves, for the dashboard
        self._state_at = 0.0
        self._state_key: tuple[object, ...] = ()
        self._leak_cursor = 0  # the engine's leak events seen: a new one refreshes the snapshot at once
        self._canceled_early: dict[str, float] = {}
        self._flags_waiting: list[FlagDone] = []  # changes asked for, in force after the next step
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._engine: Engine | None = None
        self.startup_error: BaseException | None = None
        self._snapshot = HostSnapshot()
        # Requests handed over by another thread and not yet taken in by the engine thread (they wait
        # for the step in flight, seconds under load): `snapshot` counts them as held, so a Celery worker's
        # heartbeat lists them and its web side does not take them for lost (under load a first wave of
        # requests would all end worker_lost while the worker's first step ran for seconds).
        self._arriving: set[str] = set()
        self._arriving_lock = threading.Lock()
        self._taken_in: list[str] = []  # added to the engine (or refused) since the last published snapshot
        self.metrics = EngineMetrics()
        self.engine_run = uuid.uuid4().hex[:12]  # this engine's start, as its records in the database name it

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self.startup_error is not None:
            raise RuntimeError(f"the engine failed to start: {self.startup_error}") from self.startup_error

    def stop(self) -> None:
        self._commands.put(_Stop())
        self._thread.join(timeout=10)

    @property
    def snapshot(self) -> HostSnapshot:
        """The host's state as of the engine's last step, its requests counting those handed to it since
        (not yet taken in): readable from any thread."""
        snapshot = self._snapshot
        with self._arriving_lock:
            arriving = tuple(r for r in self._arriving if r not in snapshot.request_ids)
        return replace(snapshot, request_ids=snapshot.request_ids + arriving) if arriving else snapshot

    @property
    def engine(self) -> Engine:
        """The engine, once start() returned: for its thread, and for what only reads its config."""
        if self._engine is None:
            raise RuntimeError("the engine host is not started")
        return self._engine

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def serving(self) -> bool:
        """The engine loaded and its thread still running: not stopped, not failed at start or since."""
        return self._engine is not None and self._thread.is_alive()

    # -- called from other threads --------------------------------------------------------------

    def add(self, request_id: str, prompt: str | list[int], params: SamplingParams, sink: Sink,
            user: str = "") -> None:
        # Stamped now: a request waits here for the step in flight, and that wait is part of its
        # queue time and time to first token (up to a whole step under load).
        with self._arriving_lock:
            self._arriving.add(request_id)
        self._commands.put(_Add(request_id, prompt, params, sink, user, time.monotonic()))

    def cancel(self, request_id: str, by_operator: bool = False, done: CancelDone | None = None) -> None:
        """A client's cancel, or with `by_operator` an operator's (the engine's FinishedAborted); `done`
        hears whether it found the request still running."""
        self._commands.put(_Abort(request_id, by_operator, done))

    def pick_for_audit(self, request_id: str) -> None:
        """An operator's pick: the replay audit re-runs the request once it has finished (ReplayAudit.pick)."""
        self._commands.put(_AuditPick(request_id))

    def set_flag(self, name: str, value: bool | int, done: FlagDone) -> None:
        """Change a runtime flag at the engine's next step boundary; `done` hears when it is in force."""
        self._commands.put(_SetFlag(name, value, done))

    # -- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._engine = self._factory()
        except BaseException as exc:  # reported to start(), which raises it in the caller
            self.startup_error = exc
            self._ready.set()
            return
        heap.after_load()
        self.audit = ReplayAudit(self.engine.runtime_flags.audit, self.engine.leak_events)
        self._publish_snapshot()
        self._ready.set()
        while True:
            # Idle: block until work arrives (or an audit may run). Busy: take what is queued and step.
            block = not self.engine.has_unfinished_requests() and not self.audit.waiting
            commands = [self._commands.get()] if block else []
            while not self._commands.empty():
                commands.append(self._commands.get())
            if any(isinstance(c, _Stop) for c in commands):
                return
            for command in commands:
                self._apply(command)
            self.audit.tick(self.engine)  # live work just taken in makes a running audit yield
            self._publish_snapshot()  # before the step: a long prefill must not hide what it holds
            if self.engine.has_unfinished_requests():
                self._step()
                self._publish_snapshot()
            elif self._flags_waiting:
                self.engine.apply_flags()  # idle: this is the step boundary
            self._acknowledge_flags()

    def _apply(self, command: _Command) -> None:
        match command:
            case _SetFlag():
                try:
                    self.engine.set_flag(command.name, command.value)
                except Exception as exc:  # whatever an operator (or a garbled message) asks, the engine lives on
                    _tell(command.done, None, str(exc).strip("'\""))
                else:
                    self._flags_waiting.append(command.done)
            case _Abort():
                held = self.engine.abort(command.request_id, by_operator=command.by_operator)
                if not held and not command.by_operator:  # an operator names what the dashboard showed held
                    self._remember_early_cancel(command.request_id)
                if command.done is not None:
                    _tell(command.done, held)
            case _AuditPick():
                self.audit.pick(command.request_id)
            case _Add():
                self._add(command)
            case _Stop():
                pass  # never here: the loop applies nothing of a batch that holds a stop
            case _:
                assert_never(command)

    def _add(self, command: _Add) -> None:
        request_id, sink = command.request_id, command.sink
        self._taken_in.append(request_id)  # held or answered from here on; _publish_snapshot says so
        if self._canceled_early.pop(request_id, None) is not None:
            sink.push_threadsafe(StreamEvent(finished=True, finish_reason="canceled"))
            return
        try:
            self.engine.add_request(request_id, command.prompt, command.params, command.arrival,
                                    cache_scope=command.user)  # no user finds another user's prefix
        except (PromptError, InvalidSamplingParams, RequestError, TokenizerError) as exc:
            code = "invalid_params" if isinstance(exc, InvalidSamplingParams) else "invalid_request"
            sink.push_threadsafe(StreamEvent.failure(code, str(exc)))
            return
        except Exception as exc:  # a request the checks above missed must not end the thread (and every request)
            log.exception("adding request %s failed", request_id)
            sink.push_threadsafe(StreamEvent.failure("engine_error", f"{type(exc).__name__}: {exc}"))
            return
        self._sinks[request_id] = sink
        self._users[request_id] = command.user

    def _remember_early_cancel(self, request_id: str) -> None:
        now = time.monotonic()
        self._canceled_early = {rid: t for rid, t in self._canceled_early.items() if now - t < EARLY_CANCEL_MEMORY_S}
        self._canceled_early[request_id] = now

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine isolates forward errors; anything else is a bug
            log.exception("engine step failed")
            self._fail_all(exc)
            return
        deliveries: list[tuple[Sink, StreamEvent]] = []
        for output in outputs:
            if self.audit.owns(output.request_id):  # a re-run: no client, no serving metrics, never audited
                self.audit.observe(output)
                continue
            self.metrics.observe(output)
            if output.finished:
                self.audit.offer(output)
            sink = self._sinks.get(output.request_id)
            if sink is None:
                continue
            event = self._hold.release(output.request_id, _event(output))
            if event is not None:
                deliveries.append((sink, event))
            if output.finished:
                del self._sinks[output.request_id]
                self._users.pop(output.request_id, None)
        for request_id, event in self._hold.due():
            sink = self._sinks.get(request_id)
            if sink is not None:
                deliveries.append((sink, event))
        deliver(deliveries)

    def _fail_all(self, exc: Exception) -> None:
        """A step raised: every request ends with its error, and the engine serves the next ones."""
        for request_id, sink in list(self._sinks.items()):
            held = self._hold.flush(request_id)
            if held is not None:  # the tokens it did produce reach the client before the error
                sink.push_threadsafe(held)
            sink.push_threadsafe(StreamEvent.failure("engine_error", f"{type(exc).__name__}: {exc}"))
            self.engine.abort(request_id)
            self.metrics.failed(request_id)
        self._sinks.clear()
        self._users.clear()

    def _acknowledge_flags(self) -> None:
        if self._flags_waiting:
            self._publish_snapshot()  # the flags now in force, before anyone hears they are
            for done in self._flags_waiting:
                _tell(done, self._snapshot.flags, None)
            self._flags_waiting.clear()

    def _publish_snapshot(self) -> None:
        stats, request_ids, flags = self.engine.stats(), tuple(self._sinks), self.engine.flags()
        self._snapshot = HostSnapshot(running=stats.running, waiting=stats.waiting,
                                      request_ids=request_ids, metrics=self.metrics.snapshot(stats, self.audit.counts()),
                                      flags=flags, state=self._state(request_ids, flags))
        if self._taken_in:  # after the new snapshot: a request is always in one or the other
            with self._arriving_lock:
                self._arriving.difference_update(self._taken_in)
            self._taken_in.clear()

    def _state(self, request_ids: tuple[str, ...], flags: Flags) -> EngineState:
        now = time.monotonic()
        _, self._leak_cursor = self.engine.leak_events_since(self._leak_cursor)
        key = (request_ids, self._leak_cursor, tuple(flags.values()), self.sequences_in_state)
        if self._snapshot.state is not None and key == self._state_key and now - self._state_at < STATE_EVERY_S:
            return self._snapshot.state
        self._state_key, self._state_at = key, now
        try:
            # A plain dict on the engine's side (engine/ imports nothing of workbench/): EngineState names its keys.
            return cast(EngineState, engine_state(self.engine.snapshot(self.sequences_in_state), self._users))
        except Exception as exc:  # a view for operators must never stop the engine serving
            log.exception("the engine's inspection snapshot failed")
            return {"error": f"{type(exc).__name__}: {exc}"}


def _tell(done: Callable[..., None], *answer: object) -> None:
    """Hand a flag change's or a cancel's answer to whoever asked."""
    try:
        done(*answer)
    except Exception:  # a listener gone away (its loop closed) must not take the engine thread with it
        log.exception("the listener of a flag change or a cancel failed")


def _event(output: RequestOutput) -> StreamEvent:
    return StreamEvent(index=output.index, text=output.text, token_ids=list(output.token_ids),
                       finished=output.finished, finish_reason=output.finish_reason,
                       usage=output.usage.as_dict() if output.usage else None, timings=output.timings,
                       error_code="engine_error" if output.error else None, error=output.error,
                       reproduce=None if output.record is None else output.record.as_dict(),
                       logprobs=None if output.logprobs is None else [
                           [lp.token_id, lp.logprob, [list(pair) for pair in lp.top]] for lp in output.logprobs],
                       prompt_logprobs=_prompt_records(output))


def _prompt_records(output: RequestOutput) -> list[list] | None:
    """The first delta's prompt logprobs as StreamEvent carries them (each with its token id)."""
    if output.prompt_logprobs is None or output.prompt_token_ids is None:
        return None
    return [[token, None, []] if lp is None else [token, lp.logprob, [list(pair) for pair in lp.top]]
            for token, lp in zip(output.prompt_token_ids, output.prompt_logprobs)]
