"""A request's timings count from when the serving layer handed it to the engine thread, not from when
the thread took it in: under load a request waits there for the step in flight, and that wait belongs to
its queue time and time to first token (what the chat stores and the metrics report)."""

from __future__ import annotations

import threading
import time

from engine import Engine, EngineConfig, SamplingParams
from workbench.serving.engine_host import EngineHost
from workbench.serving.streams import StreamEvent

SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
SLOW_STEP_S = 0.5


class LastEvent:
    def __init__(self) -> None:
        self.event: StreamEvent | None = None
        self.done = threading.Event()

    def push_threadsafe(self, event: StreamEvent) -> None:
        if event.finished:
            self.event = event
            self.done.set()


def timings_of_request_sent_during_a_slow_step(thread: EngineHost) -> dict:
    """Send a short request while the busy request's first step is in flight, slowed down; only that
    step is slowed, not the short request's own. (Taken in at the step boundary, the short request's
    queue time counted from there was under 1 ms.)"""
    real_step, started = thread.engine.step, threading.Event()

    def step():
        if not started.is_set():
            started.set()
            time.sleep(SLOW_STEP_S)
        return real_step()

    busy, short = LastEvent(), LastEvent()
    thread.engine.step = step
    try:
        thread.add(f"busy-{time.monotonic_ns()}", "A dictionary is", SamplingParams(max_tokens=2, temperature=0,
                                                                                    ignore_eos=True), busy)
        assert started.wait(30)
        thread.add(f"short-{time.monotonic_ns()}", "The list type", SHORT, short)
        assert short.done.wait(30) and busy.done.wait(30)
    finally:
        thread.engine.step = real_step
    return short.event.timings


def test_the_wait_for_the_step_in_flight_counts_in_queue_time_and_ttft():
    thread = EngineHost(lambda: Engine(EngineConfig(model="demo")))
    thread.start()
    try:
        waited = timings_of_request_sent_during_a_slow_step(thread)
        assert waited["queue_time"] >= SLOW_STEP_S * 0.8, waited
        assert waited["time_to_first_token"] >= waited["queue_time"]
    finally:
        thread.stop()


def test_an_arrival_from_the_future_counts_as_now():
    engine = Engine(EngineConfig(model="demo"))
    engine.add_request("r", "The list type", SHORT, arrival=time.monotonic() + 60)
    while engine.has_unfinished_requests():
        outputs = engine.step()
    assert 0 <= outputs[-1].timings["queue_time"] < 30
