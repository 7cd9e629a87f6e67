"""The Celery transport, web side: requests go to GPU workers over Redis, tokens come back to this process.

The Transport (transport.py), as the in-process transport is, so consumers cannot tell which one
serves them. One link thread with its own event loop holds this process's reply channel and does all
the Redis work: it picks a live worker for each request among those that have its model loaded (each
heartbeat names the worker's model; the least loaded by its heartbeat and what this process sent it
since), publishes the Celery task, reads the reply channel, and polls the workers' heartbeats.

Its parts, each in a module of its own: the workers as the last poll saw them and the routing choices
made from them (roster.py); the requests sent and not yet ended (pending.py: relaying their deltas in
order, cancels, the lost-worker watch); the tasks on their way to each worker (publisher.py); the reply
channel's reader (reply_reader.py); the operators' flag changes and cancels waiting for answers
(flag_fanout.py, operator_cancels.py); the dashboards' watch count (dashboard_watch.py). Its settings
come in as one LinkSettings (link_settings.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import asdict
from typing import Callable

from engine import SamplingParams
from engine.loading.model_files import load_tokenizer
from engine.loading.tokenizer import Tokenizer
from workbench.serving.celery import wire
from workbench.serving.celery.dashboard_watch import DashboardWatch
from workbench.serving.celery.flag_fanout import FlagFanout
from workbench.serving.celery.link_settings import LinkSettings
from workbench.serving.celery.operator_cancels import OperatorCancels
from workbench.serving.celery.pending import PendingRequests
from workbench.serving.celery.presence import Heartbeat, Presence
from workbench.serving.celery.publisher import Publisher
from workbench.serving.celery.redis_layer import make_layer
from workbench.serving.celery.reply_reader import read_replies_forever
from workbench.serving.celery.roster import Roster
from workbench.serving.metrics import MetricsSnapshot
from workbench.serving.streams import RequestStream, StreamEvent
from workbench.serving.transport import NOT_HELD, FlagAnswer, Flags, WorkerView

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
        self.roster = Roster(link_settings.heartbeat_s, link_settings.lost_after_s)
        self._pending = PendingRequests(self._loop, self.layer, link_settings.queue_prefix)
        self._publisher = Publisher(self._loop, self._pending)
        self._flags = FlagFanout(self._loop, self.layer, self.presence.redis, link_settings.queue_prefix)
        self._cancels = OperatorCancels(self._loop, self.layer, link_settings.queue_prefix)
        self._dashboards = DashboardWatch(self._loop, self.presence)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=30)

    def _run_loop(self) -> None:
        self._loop.run_forever()
        # A task stop() could not see end (a Redis call slow to give up, a host too busy for stop's own
        # wait) is cancelled and run out here: a task left pending at close is destroyed with an error
        # in the log of whatever runs when it is collected.
        leftovers = asyncio.all_tasks(self._loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            self._loop.run_until_complete(asyncio.wait(leftovers, timeout=5))
        self._loop.close()  # here, where no other loop runs: channels-redis closes its pools on close

    async def _open(self) -> None:
        self.reply_channel = await self.layer.new_channel(prefix="workbench-web.")
        try:
            await self._refresh()
        except Exception as exc:  # Redis away at start: the poll loop keeps trying
            log.warning("cannot reach Redis yet: %s", exc)
        replies = read_replies_forever(self.layer, self.reply_channel, self._pending, self._flags, self._cancels)
        self._tasks = [asyncio.create_task(replies), asyncio.create_task(self._poll_forever())]

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
        return sorted({beat.model for beat in self.roster.routable()})

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
        the link loop, which owns the channel layer, as flag changes are; answered by the worker."""
        future = asyncio.run_coroutine_threadsafe(self._cancel_as_operator(worker, request_id), self._loop)
        return await asyncio.wrap_future(future)

    async def audit_as_operator(self, worker: str, request_id: str) -> str | None:
        """As cancel_as_operator: the worker that holds the request audits it."""
        future = asyncio.run_coroutine_threadsafe(self._audit_pick(worker, request_id), self._loop)
        return await asyncio.wrap_future(future)

    def running_request_ids(self) -> set[str]:
        """What the live workers hold: this process's requests by their request id, others by wire id."""
        request_of = self._pending.request_ids()
        return {request_of.get(w, w) for w in self.roster.held_wire_ids()}

    def answering(self) -> bool:
        # From the web side's loop, like running_request_ids: it only reads the link loop's tables.
        return bool(self.roster.routable())

    def workers(self) -> dict[str, Heartbeat]:
        return dict(self.roster.workers)

    def flags_in_force(self) -> dict[str, Flags]:
        return self.roster.flags_in_force()

    def metrics_by_worker(self) -> dict[str, MetricsSnapshot]:
        return self.roster.metrics_by_worker()

    def watch_state(self) -> Callable[[], None]:
        """A dashboard opens; the returned unwatch closes it (dashboard_watch.py)."""
        return self._dashboards.watch()

    def workers_view(self) -> dict[str, WorkerView]:
        return self.roster.view()

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
        live = [beat for beat in self.roster.routable() if beat.model == model]
        if not live:
            stream.push_threadsafe(StreamEvent.failure(
                "unavailable", f"no GPU worker serving {model!r} is available; try again later"))
            return
        worker = self.roster.least_loaded(live, self._pending.sent_to)
        if worker is None:
            stream.push_threadsafe(StreamEvent.failure("overloaded", "every GPU worker is at capacity; try again later"))
            return
        wire_id = self._pending.add(request_id, stream, worker.worker_id)
        self._publisher.send(worker, {"request_id": wire_id, "prompt": prompt, "params": asdict(params), "user": user,
                                      "model": model}, self.reply_channel)

    async def _change_flag(self, name: str, value: bool | int, workers: list[str] | None) -> dict[str, FlagAnswer]:
        return await self._flags.change(name, value, workers, self.roster.workers, self.reply_channel)

    async def _cancel_as_operator(self, worker: str, request_id: str) -> str | None:
        refusal = self._not_listed(worker, request_id)
        return refusal or await self._cancels.cancel(worker, request_id, self.reply_channel)

    def _not_listed(self, worker: str, request_id: str) -> str | None:
        """Why `worker`'s heartbeat does not list `request_id`, or None where it does."""
        beat = self.roster.workers.get(worker)
        if beat is None:
            return "no such worker"
        return None if request_id in beat.requests else NOT_HELD

    async def _audit_pick(self, worker: str, request_id: str) -> str | None:
        refusal = self._not_listed(worker, request_id)
        if refusal:
            return refusal
        try:
            await self.layer.send(wire.control_channel(self.link_settings.queue_prefix, worker),
                                  wire.audit_pick_message(request_id))
        except Exception as exc:  # Redis away: the operator hears it, the dashboard lives on
            return f"the audit pick could not reach {worker}: {type(exc).__name__}: {exc}"
        return None

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self._refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("presence: %s: %s", type(exc).__name__, exc)
                self.roster.poll_failed()
            else:
                self._pending.watch(self.roster.workers)
            self._pending.watch_silence(self.link_settings.lost_after_s)
            await asyncio.sleep(self.link_settings.heartbeat_s / 2)

    async def _refresh(self) -> None:
        await self.presence.mark_web(self.reply_channel)
        if self._dashboards.watched:
            await self.presence.watch()
        self.roster.update(await self.presence.workers())
