"""A request handed to the engine thread counts as held at once, even while a long step keeps the thread
from taking it in (workbench/serving/engine_host.py `snapshot`). A Celery worker's heartbeat lists what
`snapshot` holds, and the web side ends a request no heartbeat confirms within WORKBENCH_WORKER_LOST_S as
worker_lost: bench/load.py's 64-client Celery run lost a first wave of requests that way while the
worker's first step ran 5 s (docs/RELIABILITY.md). Once answered, a request is held no longer, refused
ones included."""

from __future__ import annotations

import threading
import time

from engine import Engine, EngineConfig, SamplingParams
from workbench.serving.engine_host import EngineHost
from workbench.serving.streams import StreamEvent

SHORT = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


class Ending:
    def __init__(self) -> None:
        self.event: StreamEvent | None = None
        self.done = threading.Event()

    def push_threadsafe(self, event: StreamEvent) -> None:
        if event.finished or event.error:
            self.event = event
            self.done.set()


def test_a_request_handed_over_during_a_long_step_is_held_at_once_and_released_when_answered():
    host = EngineHost(lambda: Engine(EngineConfig(model="demo")))
    host.start()
    real_step, stepping, release = host.engine.step, threading.Event(), threading.Event()

    def step():
        if not stepping.is_set():
            stepping.set()
            release.wait(30)  # the first step "runs" until the test has looked
        return real_step()

    host.engine.step = step
    busy, late, refused = Ending(), Ending(), Ending()
    try:
        host.add("busy", "A dictionary is", SHORT, busy)
        assert stepping.wait(30)
        host.add("late", "The list type", SHORT, late)
        host.add("refused", [], SHORT, refused)  # an empty prompt: the engine refuses it when taken in
        # Control: the engine thread is inside its step and has not taken them in...
        assert "late" not in host._snapshot.request_ids
        # ...yet they are held from the moment they were handed over.
        assert {"busy", "late", "refused"} <= set(host.snapshot.request_ids), host.snapshot
        release.set()
        assert busy.done.wait(30) and late.done.wait(30) and refused.done.wait(30)
        assert late.event.finish_reason == "length" and refused.event.error is not None, (late.event, refused.event)
        deadline = time.monotonic() + 10
        while host.snapshot.request_ids and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.snapshot.request_ids == (), host.snapshot  # answered, refused included: held no longer
    finally:
        release.set()
        host.engine.step = real_step
        host.stop()
