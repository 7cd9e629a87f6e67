"""The in-process transport: the engine runs on a thread of the web process (the embedded default).

The engine is single-threaded by design, so the thread owns it: the web side only enqueues commands
(add, abort), and the thread applies them between steps, steps while any request is unfinished, and
hands each output to its request's stream. A cancel therefore reaches the engine at its next step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Callable

from engine import Engine, InvalidSamplingParams, PromptError, RequestError, SamplingParams
from engine.outputs import RequestOutput
from engine.tokenizer import TokenizerError
from workbench.serving.streams import RequestStream, StreamEvent

log = logging.getLogger(__name__)


class EngineThread:
    def __init__(self, engine_factory: Callable[[], Engine]) -> None:
        self._factory = engine_factory
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.engine: Engine | None = None
        self.startup_error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self.startup_error is not None:
            raise RuntimeError(f"the engine failed to start: {self.startup_error}") from self.startup_error

    def stop(self) -> None:
        self._commands.put(("stop",))
        self._thread.join(timeout=10)

    # -- called from the event loop --------------------------------------------------------------

    def submit(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> RequestStream:
        stream = RequestStream(request_id, asyncio.get_running_loop())
        self._commands.put(("add", request_id, prompt, params, stream))
        return stream

    def cancel(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def running_request_ids(self) -> set[str]:
        engine = self.engine
        return {seq.request_id for seq in engine.scheduler.running} if engine else set()

    # -- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine = self._factory()
        except BaseException as exc:  # reported to start(), which raises it in the caller
            self.startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        while True:
            # Idle: block until work arrives. Busy: take what is queued and step.
            block = not self.engine.has_unfinished_requests()
            commands = [self._commands.get()] if block else []
            while not self._commands.empty():
                commands.append(self._commands.get())
            if any(c[0] == "stop" for c in commands):
                return
            for command in commands:
                self._apply(command)
            if self.engine.has_unfinished_requests():
                self._step()

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort":
            self.engine.abort(command[1])
            return
        _, request_id, prompt, params, stream = command
        try:
            self.engine.add_request(request_id, prompt, params)
        except (PromptError, InvalidSamplingParams, RequestError, TokenizerError) as exc:
            code = "invalid_params" if isinstance(exc, InvalidSamplingParams) else "invalid_request"
            stream.push_threadsafe(StreamEvent(finished=True, finish_reason="error", error_code=code, error=str(exc)))
            return
        self._streams[request_id] = stream

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine isolates forward errors; anything else is a bug
            log.exception("engine step failed")
            for request_id, stream in list(self._streams.items()):
                stream.push_threadsafe(StreamEvent(finished=True, finish_reason="error", error_code="engine_error",
                                                   error=f"{type(exc).__name__}: {exc}"))
                self.engine.abort(request_id)
            self._streams.clear()
            return
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            stream.push_threadsafe(_event(output))
            if output.finished:
                del self._streams[output.request_id]


def _event(output: RequestOutput) -> StreamEvent:
    return StreamEvent(index=output.index, text=output.text, token_ids=list(output.token_ids),
                       finished=output.finished, finish_reason=output.finish_reason,
                       usage=output.usage.as_dict() if output.usage else None, timings=output.timings,
                       error_code="engine_error" if output.error else None, error=output.error)
