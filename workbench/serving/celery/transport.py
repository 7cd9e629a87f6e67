"""The Celery transport, web side: requests go to GPU workers over Redis, tokens come back to this process.

The Transport (transport.py), as the in-process transport is, so consumers cannot tell which one
serves them. One link thread with its own event loop holds this process's reply channel and does all
the Redis work: it picks a live worker for each request among those that have its model loaded (each
heartbeat names the worker's model; the least loaded by its heartbeat and what this process sent it
since), publishes the Celery task, reads the reply channel, and polls the workers' heartbeats.

Two parts of it keep their own tables on that loop: the requests sent and not yet ended (pending.py:
relaying their deltas in order, cancels, the lost-worker watch), and the operators' flag changes
waiting for answers (flag_fanout.py). The rest reads the last poll's heartbeats: the routing, the
dashboard's views, the flags in force; the tokenizers and the dashboards' watch count need no loop.
Its settings come in as one LinkSettings (link_settings.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from dataclasses import asdict
from functools import partial
from typing import Callable, cast

from engine import SamplingParams
from engine.loading.loader import load_tokenizer
from engine.loading.tokenizer import Tokenizer
from workbench.celery import app as celery_app
from workbench.serving.celery import wire
from workbench.serving.celery.flag_fanout import FlagFanout
from workbench.serving.celery.link_settings import LinkSettings
from workbench.serving.celery.pending import PendingRequests
from workbench.serving.celery.presence import Heartbeat, Presence
from workbench.serving.celery.redis_layer import make_layer
from workbench.serving.metrics import MetricsSnapshot
from workbench.serving.streams import RequestStream, StreamEvent, deliver
from workbench.serving.transport import FlagAnswer, Flags, WorkerView

log = logging.getLogger(__name__)


class CeleryTransport:
    def __init__(self, link_settings: LinkSettings) -> None:
        self.link_settings = link_settings
        self.tokenizer = load_tokenizer(link_settings.model)
        # Other models' tokenizers, read when a request first names one: this process needs each served
        # model's tokenizer files (the same name or path the workers were started with).
        self._tokenizers: dict[str, Tokenizer] = {link_settings.model: self.tokenizer}
        self._tokenizers_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="celery-link", daemon=True)
        # Built here, connected on the link loop at first use: neither opens a connection before start().
        self.layer = make_layer(link_settings.redis_url)
        self.presence = Presence(link_settings.redis_url, link_settings.queue_prefix, link_settings.lost_after_s)
        self.reply_channel = ""  # named by the layer once the link loop runs (start)
        self._pending = PendingRequests(self._loop, self.layer, link_settings.queue_prefix)
        self._flags = FlagFanout(self._loop, self.layer, self.presence.redis, link_settings.queue_prefix)
        self._outgoing: dict[str, list[dict]] = {}  # worker id -> requests waiting for the next task to it
        self._publishing: set[str] = set()  # workers with a task on its way
        self._workers: dict[str, Heartbeat] = {}  # as of the last successful poll
        self._beat_changed: dict[str, tuple[float, float]] = {}  # worker -> (its sent_at, when it changed)
        self._polled_at = 0.0
        self._dashboards = 0  # dashboards open in this process: while any is, workers send sequence lists
        self._dashboards_lock = threading.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=30)

    def _run_loop(self) -> None:
        self._loop.run_forever()
        self._loop.close()  # here, where no other loop runs: channels-redis closes its pools on close

    async def _open(self) -> None:
        self.reply_channel = await self.layer.new_channel(prefix="workbench-web.")
        try:
            await self._refresh()
        except Exception as exc:  # Redis away at start: the poll loop keeps trying
            log.warning("cannot reach Redis yet: %s", exc)
        self._tasks = [asyncio.create_task(self._receive_forever()), asyncio.create_task(self._poll_forever())]

    def stop(self) -> None:
        """Stop the link thread. Never raises: with Redis slow or away, connections are left to close
        with the loop rather than holding the caller."""
        async def close() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.wait(self._tasks, timeout=2)
            await asyncio.wait_for(self.presence.close(), 2)
            await asyncio.wait_for(self.layer.close_pools(), 2)
        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        except Exception as exc:
            log.warning("closing the Celery transport: %s: %s", type(exc).__name__, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # -- the interface (called from the consumers' event loop) -----------------------------------

    def tokenizer_for(self, model: str) -> Tokenizer:
        with self._tokenizers_lock:
            if model not in self._tokenizers:
                self._tokenizers[model] = load_tokenizer(model)
            return self._tokenizers[model]

    def models(self) -> list[str]:
        return sorted({beat.model for beat in self._routable()})

    def submit(self, request_id: str, prompt: str | list[int], params: SamplingParams,
               user: str = "", model: str = "") -> RequestStream:
        stream = RequestStream(request_id, asyncio.get_running_loop())
        self._loop.call_soon_threadsafe(self._dispatch, request_id, prompt, params, stream, user,
                                        model or self.link_settings.model)
        return stream

    def cancel(self, request_id: str) -> None:
        self._loop.call_soon_threadsafe(self._pending.cancel_request, request_id)

    async def cancel_as_operator(self, worker: str, request_id: str) -> str | None:
        """`request_id`: the wire id the worker's heartbeat lists (what the dashboard shows). Sent from
        the link loop, which owns the channel layer, as flag changes are."""
        future = asyncio.run_coroutine_threadsafe(self._cancel_as_operator(worker, request_id), self._loop)
        return await asyncio.wrap_future(future)

    async def _cancel_as_operator(self, worker: str, request_id: str) -> str | None:
        beat = self._workers.get(worker)
        if beat is None:
            return "no such worker"
        if request_id not in beat.requests:
            return "no such request on this worker (it may have just finished)"
        try:
            await self.layer.send(wire.control_channel(self.link_settings.queue_prefix, worker),
                                  wire.cancel_message(request_id, by_operator=True))
        except Exception as exc:  # Redis away: the operator hears it, the dashboard lives on
            return f"the cancel could not reach {worker}: {type(exc).__name__}: {exc}"
        return None

    def running_request_ids(self) -> set[str]:
        """What the live workers hold: this process's requests by their request id, others by wire id."""
        request_of = self._pending.request_ids()
        held = {wire_id for beat in list(self._workers.values()) for wire_id in beat.requests}
        return {request_of.get(w, w) for w in held}

    def answering(self) -> bool:
        # From the web side's loop, like running_request_ids: it only reads the link loop's tables.
        return bool(self._routable())

    def workers(self) -> dict[str, Heartbeat]:
        return dict(self._workers)

    def flags_in_force(self) -> dict[str, Flags]:
        return {worker_id: beat.flags for worker_id, beat in self._workers.items()}

    def metrics_by_worker(self) -> dict[str, MetricsSnapshot]:
        # A heartbeat's metrics are its engine's MetricsSnapshot, or {} before the first.
        return {worker_id: cast(MetricsSnapshot, beat.metrics) for worker_id, beat in self._workers.items()
                if beat.metrics}

    def watch_state(self) -> Callable[[], None]:
        """A dashboard opens: the workers include their sequence lists in their heartbeats (within one
        heartbeat) until the returned unwatch is called for every watch and the Redis mark expires."""
        with self._dashboards_lock:
            self._dashboards += 1
            first = self._dashboards == 1
        if first:  # say so now, not at the next poll
            asyncio.run_coroutine_threadsafe(self._mark_watched(), self._loop)
        unwatched = threading.Event()

        def unwatch() -> None:
            if not unwatched.is_set():
                unwatched.set()
                with self._dashboards_lock:
                    self._dashboards -= 1

        return unwatch

    async def _mark_watched(self) -> None:
        try:
            await self.presence.watch()
        except Exception as exc:  # the next poll tries again
            log.warning("presence: %s: %s", type(exc).__name__, exc)

    def workers_view(self) -> dict[str, WorkerView]:
        """The dashboard's view of each live worker, from its last heartbeat."""
        now = time.time()
        return {worker_id: {"device": beat.device, "model": beat.model, "engine_run": beat.engine_run,
                            "running": beat.running, "waiting": beat.waiting, "draining": beat.draining,
                            "heartbeat_age_s": round(max(0.0, now - beat.sent_at)),  # whole s: fewer frames
                            "flags": beat.flags, "state": beat.state}
                for worker_id, beat in sorted(self._workers.items())}

    async def change_flag(self, name: str, value: bool | int,
                          workers: list[str] | None = None) -> dict[str, FlagAnswer]:
        """Ask `workers` (None: every live worker, and every worker that starts later) to change a flag;
        returns each one's answer: the flags in force after its next step boundary, or an error."""
        future = asyncio.run_coroutine_threadsafe(self._change_flag(name, value, workers), self._loop)
        return await asyncio.wrap_future(future)

    # -- the link loop ---------------------------------------------------------------------------

    def _dispatch(self, request_id: str, prompt: str | list[int], params: SamplingParams, stream: RequestStream,
                  user: str, model: str) -> None:
        """Choose a worker that has `model` loaded and register the request before anything awaits, so a
        cancel that follows finds where it went."""
        live = [beat for beat in self._routable() if beat.model == model]
        if not live:
            stream.push_threadsafe(StreamEvent.failure(
                "unavailable", f"no GPU worker serving {model!r} is available; try again later"))
            return
        worker = self._least_loaded(live)
        if worker is None:
            stream.push_threadsafe(StreamEvent.failure("overloaded", "every GPU worker is at capacity; try again later"))
            return
        wire_id = self._pending.add(request_id, stream, worker.worker_id)
        self._outgoing.setdefault(worker.worker_id, []).append(
            {"request_id": wire_id, "prompt": prompt, "params": asdict(params), "user": user, "model": model})
        if worker.worker_id not in self._publishing:
            self._publishing.add(worker.worker_id)
            self._loop.create_task(self._publish(worker))

    async def _change_flag(self, name: str, value: bool | int, workers: list[str] | None) -> dict[str, FlagAnswer]:
        return await self._flags.change(name, value, workers, self._workers, self.reply_channel)

    def _routable(self) -> list[Heartbeat]:
        """Workers taking requests: not draining, and whose heartbeat moved lately (a worker killed a
        moment ago still has its key in Redis until it expires). Judged by this process's own clock,
        so clock skew between machines cannot make a live worker look stale."""
        now, fresh_for = time.monotonic(), 2.5 * self.link_settings.heartbeat_s
        return [beat for worker_id, beat in self._workers.items()
                if not beat.draining and now - self._beat_changed.get(worker_id, (0, 0))[1] < fresh_for]

    def _least_loaded(self, live: list[Heartbeat]) -> Heartbeat | None:
        def held(beat: Heartbeat) -> int:
            return len(self._pending.sent_to(beat.worker_id) | set(beat.requests))

        loads = [(held(beat), beat) for beat in live]
        open_loads = [(n, beat) for n, beat in loads if n < beat.capacity]
        if not open_loads:
            return None
        least = min(n for n, _ in open_loads)
        return random.choice([beat for n, beat in open_loads if n == least])

    async def _publish(self, worker: Heartbeat) -> None:
        """Send the requests waiting for `worker`, one task at a time: what arrives while a task is on
        its way goes in the next. Requests come in bursts (a wave of replies ends in one engine step and
        its clients answer together), and a task costs ~0.5-0.9 ms of CPU here and more on the worker,
        one after another (docs/BENCHMARKS.md): with one task per request, the burst's last waited."""
        try:
            while batch := [r for r in self._outgoing.pop(worker.worker_id, []) if r["request_id"] in self._pending]:
                ids = [r["request_id"] for r in batch]
                # argsrepr: what Celery shows of a task's arguments in its headers, and so in its logs,
                # events and monitors (Flower). Left to Celery it holds the prompts; a user's
                # conversation is not for them.
                send = partial(celery_app.send_task, wire.GENERATE_TASK, args=[batch, self.reply_channel],
                               argsrepr=f"[{ids!r} (prompts withheld)]", kwargsrepr="{}",
                               queue=worker.queue, expires=wire.TASK_EXPIRES_S, retry=False)
                try:
                    await self._loop.run_in_executor(None, send)
                except Exception as exc:
                    log.warning("could not send %s to %s: %s", ids, worker.worker_id, exc)
                    for wire_id in ids:
                        self._pending.fail(wire_id, "unavailable",
                                           "the request could not reach a GPU worker (is Redis up?)")
        finally:
            self._publishing.discard(worker.worker_id)

    async def _receive_forever(self) -> None:
        while True:
            try:
                messages = await self.layer.receive_batch(self.reply_channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("reply channel: %s: %s; retrying", type(exc).__name__, exc)
                await asyncio.sleep(0.5)
                continue
            deliveries: list[tuple[RequestStream, StreamEvent]] = []
            for message in messages:
                try:
                    if message.get("type") == wire.FLAG_DONE:
                        self._flags.answered(message)
                        continue
                    relayed = (self._pending.relay(wire_id, event) for wire_id, event in wire.events_of(message))
                    deliveries += filter(None, relayed)
                except Exception:  # a garbled message (a worker of another version?) must not end every stream here
                    log.exception("unreadable message on the reply channel; requests it carried end with an error "
                                  "(delivery_gap at their next delta, or worker_lost)")
            # A message holds a worker's step for many requests, a batch several steps: one wake-up of
            # the consumers' loop for all of it.
            deliver(deliveries)

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self._refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("presence: %s: %s", type(exc).__name__, exc)
                if time.monotonic() - self._polled_at > self.link_settings.lost_after_s:
                    self._workers = {}  # nothing known for that long: no worker counts as live
            else:
                self._pending.watch(self._workers)
            self._pending.watch_silence(self.link_settings.lost_after_s)
            await asyncio.sleep(self.link_settings.heartbeat_s / 2)

    async def _refresh(self) -> None:
        await self.presence.mark_web(self.reply_channel)
        if self._dashboards:
            await self.presence.watch()
        workers = await self.presence.workers()
        now = self._polled_at = time.monotonic()
        for worker_id, beat in workers.items():
            if self._beat_changed.get(worker_id, (None,))[0] != beat.sent_at:
                self._beat_changed[worker_id] = (beat.sent_at, now)
        self._beat_changed = {w: seen for w, seen in self._beat_changed.items() if w in workers}
        self._workers = workers
