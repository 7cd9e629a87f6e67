"""The in-process transport: the engine on a thread of this web process (the embedded default).

It is the Transport (transport.py) over one EngineHost (engine_host.py): a request's stream is a
RequestStream that the engine thread pushes to directly, and every operator call names the one worker
there is, LOCAL_WORKER. Everything it reports comes from the host's published HostSnapshot, so the
consumers' event loop never waits for the engine thread.
"""

from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

from engine import SamplingParams
from engine.loading.tokenizer import Tokenizer
from workbench.serving.engine_host import EngineHost
from workbench.serving.metrics import MetricsSnapshot
from workbench.serving.streams import RequestStream, StreamEvent
from workbench.serving.transport import (CANCEL_ANSWER_S, FINISHED_FIRST, FLAG_ANSWER_S, NOT_HELD, FlagAnswer, Flags,
                                         WorkerView)

Answer = TypeVar("Answer")  # what the engine thread answers: the flags in force, or whether a cancel found its request
LOCAL_WORKER = "in-process"  # the in-process transport's one engine, by the name a worker would have


class InProcessTransport:
    def __init__(self, host: EngineHost, model: str) -> None:
        """`model`: the name the host's engine is configured with, its one model."""
        self.host, self.model = host, model

    def start(self) -> None:
        self.host.start()

    def stop(self) -> None:
        self.host.stop()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.host.tokenizer

    def tokenizer_for(self, model: str) -> Tokenizer:
        if model != self.model:
            raise KeyError(f"this process serves {self.model!r}, not {model!r}")
        return self.host.tokenizer

    def models(self) -> list[str]:
        return [self.model]

    def submit(self, request_id: str, prompt: str | list[int], params: SamplingParams,
               user: str = "", model: str = "") -> RequestStream:
        stream = RequestStream(request_id, asyncio.get_running_loop())
        if model not in ("", self.model):  # the web side resolves names first: only a race or a bug gets here
            stream.push_threadsafe(StreamEvent.failure("unavailable", f"no engine here serves the model {model!r}"))
            return stream
        self.host.add(request_id, prompt, params, stream, user)
        return stream

    def cancel(self, request_id: str) -> None:
        self.host.cancel(request_id)

    async def cancel_as_operator(self, worker: str, request_id: str) -> str | None:
        if worker != LOCAL_WORKER:
            return "no such worker"
        if request_id not in self.host.snapshot.request_ids:
            return NOT_HELD
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()

        def done(held: bool) -> None:  # on the engine thread
            loop.call_soon_threadsafe(_settle, answer, held)

        self.host.cancel(request_id, by_operator=True, done=done)
        try:
            held = await asyncio.wait_for(answer, CANCEL_ANSWER_S)
        except asyncio.TimeoutError:
            return f"no answer within {CANCEL_ANSWER_S:.0f} s (unconfirmed: it may still end canceled)"
        return None if held else FINISHED_FIRST

    async def audit_as_operator(self, worker: str, request_id: str) -> str | None:
        if worker != LOCAL_WORKER:
            return "no such worker"
        if request_id not in self.host.snapshot.request_ids:
            return NOT_HELD
        self.host.pick_for_audit(request_id)
        return None

    def running_request_ids(self) -> set[str]:
        return set(self.host.snapshot.request_ids)

    def answering(self) -> bool:
        return self.host.serving

    async def change_flag(self, name: str, value: bool | int,
                          workers: list[str] | None = None) -> dict[str, FlagAnswer]:
        """This process's engine is the one worker, LOCAL_WORKER; any other named is no such worker."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[FlagAnswer] = loop.create_future()

        def done(in_force: Flags | None, error: str | None) -> None:  # on the engine thread
            result: FlagAnswer = {"in_force": in_force} if error is None else {"error": error}
            loop.call_soon_threadsafe(_settle, answer, result)

        answers: dict[str, FlagAnswer] = {worker: {"error": "no such worker"}
                                          for worker in workers or [] if worker != LOCAL_WORKER}
        if workers is None or LOCAL_WORKER in workers:
            self.host.set_flag(name, value, done)
            try:
                answers[LOCAL_WORKER] = await asyncio.wait_for(answer, FLAG_ANSWER_S)
            except asyncio.TimeoutError:
                answers[LOCAL_WORKER] = {"error": f"no answer within {FLAG_ANSWER_S:.0f} s (unconfirmed)"}
        return answers

    def flags_in_force(self) -> dict[str, Flags]:
        return {LOCAL_WORKER: self.host.snapshot.flags or {}}

    def metrics_by_worker(self) -> dict[str, MetricsSnapshot]:
        metrics = self.host.snapshot.metrics
        return {LOCAL_WORKER: metrics} if metrics else {}

    def watch_state(self) -> Callable[[], None]:
        """Here the snapshot is always whole (it never leaves the process), so the returned unwatch
        does nothing. The Celery transport's asks its workers for the sequence list."""
        return lambda: None

    def workers_view(self) -> dict[str, WorkerView]:
        snapshot, config = self.host.snapshot, self.host.engine.config
        return {LOCAL_WORKER: {"device": config.device, "model": config.model, "engine_run": self.host.engine_run,
                               "running": snapshot.running, "waiting": snapshot.waiting, "draining": False,
                               "flags": snapshot.flags or {}, "state": snapshot.state or {}}}


def _settle(answer: asyncio.Future[Answer], result: Answer) -> None:
    """The engine thread's answer, unless the asker gave up on it first (wait_for cancels it at its timeout)."""
    if not answer.done():
        answer.set_result(result)
