"""A Celery GPU worker's host: one engine per process, and the link that connects it to the web side.

`celery -A workbench worker --pool solo` (docs/OPERATIONS.md) runs one of these. The engine is
created when the worker is ready, in the process that will run it: the solo pool never forks, so
CUDA is never touched before a fork, and a prefork pool is refused outright (it would put one engine
per child on the same GPU). The `workbench.generate` task only admits requests; the engine host
(engine_host.py, the one the in-process transport has too) batches every admitted request
continuously; the link loop (its own thread and event loop) sends the outputs back, takes cancels from
the control channel, and drops the requests of web processes that went away; the heartbeat has a
thread of its own (heartbeat.py), so that neither the engine's step nor the link's work can delay it.

The link's loops share the worker's state (the outbox, draining) in one class; the reply channel of
every request held is a table of its own (reply_channels.py), and the queue's deletion at a stop a
function of its own (worker_queue.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from typing import cast

import redis
from celery import Celery

from engine import Engine, EngineConfig, InvalidSamplingParams, SamplingParams
from workbench.serving.celery import wire
from workbench.serving.celery.outbox import Outbox
from workbench.serving.celery.heartbeat import HeartbeatThread
from workbench.serving.celery.presence import Heartbeat, Presence, admit_once
from workbench.serving.celery.redis_layer import OneTripChannelLayer, make_layer
from workbench.serving.celery.reply_channels import ReplyChannels
from workbench.serving.celery.worker_queue import delete_queue
from workbench.serving.celery.worker_settings import WorkerSettings
from workbench.serving.engine_host import STATE_EVERY_S, CancelDone, EngineHost
from workbench.serving.engine_settings import served_engine_config
from workbench.serving.streams import StreamEvent

log = logging.getLogger(__name__)

# A web process unreachable this long (Redis away, or it died) loses its requests here: they are
# aborted rather than generated for nobody. Its clients have had an error from their own side by then.
UNDELIVERABLE_S = 30.0


def new_worker_id() -> str:
    """Unique per process start, so a restarted worker never reads its predecessor's queue."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class WorkerHost:
    def __init__(self, worker_id: str, engine_config: EngineConfig, app: Celery,
                 worker_settings: WorkerSettings) -> None:
        self.worker_id = worker_id
        self.app = app  # the Celery app that runs this worker (its queues and broker connection)
        self.settings = worker_settings
        self.queue = wire.queue_name(worker_settings.queue_prefix, worker_id)
        self.control_channel = wire.control_channel(worker_settings.queue_prefix, worker_id)
        self.engine_config = engine_config
        self.engine_host = EngineHost(lambda: Engine(engine_config), worker_settings.stream_interval,
                                      worker_settings.stream_gap_s)
        self.started_at = time.time()
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self.outbox = Outbox(lambda: self._loop.call_soon_threadsafe(self._wake.set))
        self._replies = ReplyChannels()
        self.started = False
        self._draining = False
        self._tasks: list[asyncio.Task] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="worker-link", daemon=True)
        self._redis = redis.Redis.from_url(worker_settings.redis_url, socket_timeout=5, socket_connect_timeout=3)
        self.heartbeat = HeartbeatThread(worker_settings.redis_url, worker_settings.queue_prefix,
                                         worker_settings.heartbeat_s, worker_settings.lost_after_s,
                                         self._compose_heartbeat, lambda: list(self.engine_host.snapshot.request_ids),
                                         self._dashboards_watched, self._apply_flags_in_force)

    def start(self) -> None:
        self.engine_host.start()  # loads the model; raises if it cannot
        self._apply_flags_in_force()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=30)
        self.heartbeat.start()
        self.started = True
        log.info("worker %s ready: model %s on %s, queue %s", self.worker_id, self.engine_config.model,
                 self.engine_config.device, self.queue)

    async def _open(self) -> None:
        self.layer: OneTripChannelLayer = make_layer(self.settings.redis_url)
        self.presence = Presence(self.settings.redis_url, self.settings.queue_prefix, self.settings.lost_after_s)
        for loop in (self._control, self._deliveries, self._orphans):
            self._tasks.append(asyncio.create_task(_forever(loop)))

    def _apply_flags_in_force(self) -> None:
        """The flags operators set for every worker apply to one that starts later too. Once more after
        the first heartbeat: a change for all workers made while this one started was seen by nobody."""
        stored = self._redis.hgetall(wire.flags_key(self.settings.queue_prefix))
        for name, raw in sorted(stored.items()):
            applied = threading.Event()
            self.engine_host.set_flag(name.decode() if isinstance(name, bytes) else name, json.loads(raw),
                                      lambda in_force, error: applied.set())
            applied.wait(timeout=10)

    def begin_drain(self) -> None:
        """Shutdown began: say so in a heartbeat now, so the web side routes nothing new here."""
        self._draining = True
        self.heartbeat.beat_soon()

    def stop(self) -> None:
        """Warm shutdown: take nothing new, let held requests finish (up to WORKBENCH_DRAIN_S), then cancel."""
        self.begin_drain()
        deadline = time.monotonic() + self.settings.drain_s
        while self.engine_host.snapshot.request_ids and time.monotonic() < deadline:
            time.sleep(0.1)
        for request_id in self.engine_host.snapshot.request_ids:
            self.engine_host.cancel(request_id)
        deadline = time.monotonic() + 5  # the cancels' final events reach the outbox and go out
        while (self.engine_host.snapshot.request_ids or self.outbox) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.engine_host.stop()
        self.heartbeat.stop(retire_worker=self.worker_id)
        delete_queue(self.app, self.queue)

    # -- the Celery task's side (the worker's main thread) --------------------------------------

    def admit(self, requests: list[dict], reply_channel: str) -> None:
        """A task's requests (request_id, prompt, params, user, model) into the engine, in order."""
        if not isinstance(requests, list):
            log.warning("dropped a task whose requests are not a list")
            return
        well_formed = [r for r in requests if isinstance(r, dict) and isinstance(r.get("request_id"), str)]
        if len(well_formed) < len(requests):
            log.warning("dropped %d malformed request(s) of a task", len(requests) - len(well_formed))
        firsts = admit_once(self._redis, self.settings.queue_prefix,
                            [r["request_id"] for r in well_formed], self.worker_id)
        for request, first in zip(well_formed, firsts):
            request_id = request["request_id"]
            if not first:
                # A redelivered task: the request ran (or runs) already. Never twice; the client has its answer.
                log.warning("refused %s: admitted before", request_id)
                continue
            log.info("admitted %s", request_id)
            sink = self.outbox.sink(reply_channel, request_id)
            model = request.get("model")
            if model is not None and model != self.engine_config.model:
                # Its prompt was rendered with another model's tokenizer: never run it on this one.
                sink.push_threadsafe(StreamEvent.failure(
                    "unavailable", f"routed to a worker serving {self.engine_config.model!r}, not {model!r}"))
                continue
            try:
                sampling = SamplingParams.from_dict(request.get("params"))
            except (InvalidSamplingParams, TypeError) as exc:
                sink.push_threadsafe(StreamEvent.failure("invalid_params", str(exc)))
                continue
            self._replies.hold(request_id, reply_channel)
            user = request.get("user")
            prompt = cast("str | list[int]", request.get("prompt"))  # unchecked: the engine refuses a garbled one
            self.engine_host.add(request_id, prompt, sampling, sink,
                                   user if isinstance(user, str) else "")

    # -- the link loop ---------------------------------------------------------------------------

    def _compose_heartbeat(self) -> Heartbeat:
        """This moment's heartbeat, from what the engine host last published (nothing here waits for
        the engine): on the heartbeat thread."""
        snapshot = self.engine_host.snapshot
        return Heartbeat(
            worker_id=self.worker_id, queue=self.queue,
            hostname=socket.gethostname(), pid=os.getpid(), device=self.engine_config.device,
            model=self.engine_config.model, capacity=self.settings.capacity,
            started_at=self.started_at, running=snapshot.running, waiting=snapshot.waiting,
            requests=list(snapshot.request_ids), flags=snapshot.flags or {},
            draining=self._draining, metrics=snapshot.metrics or {}, engine_run=self.engine_host.engine_run,
            state=snapshot.state or {})

    def _dashboards_watched(self, watched: bool) -> None:
        """After each heartbeat: whether a dashboard is open anywhere decides whether the engine lists
        its sequences (they ride the heartbeat)."""
        if watched != self.engine_host.sequences_in_state:
            self.engine_host.sequences_in_state = watched
            if watched:  # a dashboard just opened: the list once the engine has taken it (<= 0.1 s)
                self.heartbeat.beat_soon(2 * STATE_EVERY_S)

    async def _control(self) -> None:
        while True:
            message = await self.layer.receive(self.control_channel)
            if message.get("type") == wire.CANCEL and isinstance(message.get("request_id"), str):
                by_operator = message.get("by_operator") is True
                log.info("cancel %s%s", message["request_id"], " by an operator" if by_operator else "")
                self.engine_host.cancel(message["request_id"], by_operator=by_operator,
                                        done=self._cancel_answer(message))
            elif message.get("type") == wire.AUDIT_PICK and isinstance(message.get("request_id"), str):
                log.info("audit %s, an operator's pick", message["request_id"])
                self.engine_host.pick_for_audit(message["request_id"])
            elif message.get("type") == wire.SET_FLAG:
                self._set_flag(message)

    def _set_flag(self, message: dict) -> None:
        log.info("flag %r = %r (change %s)", message.get("name"), message.get("value"), message.get("change_id"))
        reply_channel = message.get("reply_channel")
        if not isinstance(reply_channel, str):
            return  # nobody to answer: a garbled message

        def done(in_force: dict | None, error: str | None) -> None:  # on the engine thread
            answer = wire.flag_done_message(message.get("change_id"), self.worker_id, in_force, error)
            asyncio.run_coroutine_threadsafe(self._answer(reply_channel, answer), self._loop)

        # Unchecked here on purpose: the engine refuses a garbled name or value, and done() answers why.
        name, value = cast(str, message.get("name")), cast("bool | int", message.get("value"))
        self.engine_host.set_flag(name, value, done)

    def _cancel_answer(self, message: dict) -> CancelDone | None:
        """What tells an operator's web process whether the cancel found the request still running; None
        for a client's cancel, which nobody waits on."""
        reply_channel = message.get("reply_channel")
        if message.get("by_operator") is not True or not isinstance(reply_channel, str):
            return None

        def done(held: bool) -> None:  # on the engine thread
            answer = wire.cancel_done_message(message.get("ask_id"), held)
            asyncio.run_coroutine_threadsafe(self._answer(reply_channel, answer), self._loop)
        return done

    async def _answer(self, reply_channel: str, answer: dict) -> None:
        """A flag change's or an operator's cancel's answer, to the web process that asked."""
        self.heartbeat.beat_soon()  # the heartbeat shows the flags in force, and the requests held, at once
        try:
            await self.layer.send(reply_channel, answer)
        except Exception as exc:  # the heartbeat still shows what is in force and held
            log.warning("could not answer %s: %s", answer["type"], exc)

    async def _deliveries(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for reply_channel, events in self.outbox.take().items():
                await self._deliver(reply_channel, events)

    async def _deliver(self, reply_channel: str, events: dict[str, StreamEvent]) -> None:
        try:
            await self.layer.send(reply_channel, wire.events_message(events))
        except Exception as exc:  # Redis away, or the web process's channel full: keep, merge, retry
            failing_for = self.outbox.put_back(reply_channel, events)
            if failing_for > UNDELIVERABLE_S:
                log.warning("giving up on %s after %.0f s: %s", reply_channel, failing_for, exc)
                self._abandon(reply_channel)
            else:
                self._loop.call_later(0.5, self._wake.set)
            return
        self.outbox.sent(reply_channel)
        self._replies.finished(request_id for request_id, event in events.items() if event.finished)

    async def _orphans(self) -> None:
        """Requests whose web process is gone are canceled (its clients can never be answered). Gone
        means unmarked at two checks in a row: one miss may be Redis just restarted, empty."""
        missed: set[str] = set()
        while True:
            await asyncio.sleep(2 * self.settings.heartbeat_s)
            channels = self._replies.channels()
            missing = set(channels) - await self.presence.webs_alive(channels)
            for channel in missing & missed:
                log.warning("web process of %s is gone; canceling its requests", channel)
                self._abandon(channel)
            missed = missing

    def _abandon(self, reply_channel: str) -> None:
        self.outbox.discard(reply_channel)
        if self.outbox:  # other channels' deltas may have arrived meanwhile without a wake-up
            self._wake.set()
        for request_id in self._replies.forget_channel(reply_channel):
            self.engine_host.cancel(request_id)


async def _forever(loop) -> None:
    """Run one of the link's loops, surviving Redis going away and coming back."""
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: %s: %s; retrying", loop.__name__, type(exc).__name__, exc)
            await asyncio.sleep(0.5)


_host: WorkerHost | None = None


def host() -> WorkerHost:
    if _host is None:
        raise RuntimeError("no engine in this process: start it with `celery -A workbench worker --pool solo`")
    return _host


def prepare_host(app: Celery) -> WorkerHost:
    """Before the worker consumes: its identity and queue (the engine loads later, in start())."""
    global _host
    config = served_engine_config()
    _host = WorkerHost(new_worker_id(), config, app, WorkerSettings.from_django())
    return _host


def begin_drain() -> None:
    if _host is not None and _host.started:
        _host.begin_drain()


def stop_host() -> None:
    if _host is not None and _host.started:
        _host.stop()
