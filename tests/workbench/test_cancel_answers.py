"""An operator's cancel is answered by the engine that holds the request (workbench/serving/engine_host.py
`cancel`'s `done`), not by what the dashboard last showed: a request listed as held can finish in the step
under way when the cancel arrives, and the operator then hears that nothing was canceled, not a cancel
that never happened. The control: a request still running at the cancel ends canceled, answered None.
The Celery worker's answer is test_celery_cluster.py's."""

from __future__ import annotations

import asyncio
import threading

from engine import Engine, EngineConfig, SamplingParams
from tests.workbench.test_held_while_stepping import Ending
from workbench.serving.engine_host import EngineHost
from workbench.serving.inprocess import LOCAL_WORKER, InProcessTransport
from workbench.serving.transport import FINISHED_FIRST

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)  # ends in the step that takes it in
LONG = SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)  # to the model's length


def test_a_cancel_that_meets_a_finished_request_says_nothing_was_canceled():
    host = EngineHost(lambda: Engine(EngineConfig(model="demo")))
    transport = InProcessTransport(host, "demo")
    host.start()
    real_step, real_cancel = host.engine.step, host.cancel
    stepping, release = threading.Event(), threading.Event()

    def step():
        if not stepping.is_set():
            stepping.set()
            release.wait(30)  # the step that finishes the request waits until the cancel is queued
        return real_step()

    def cancel(*args, **kwargs):
        real_cancel(*args, **kwargs)
        release.set()

    host.engine.step, host.cancel = step, cancel
    short, long = Ending(), Ending()
    try:
        host.add("short", "The list type", ONE_TOKEN, short)
        assert stepping.wait(30)
        assert "short" in host.snapshot.request_ids, "liveness: the operator's view lists it as held"
        answer = asyncio.run(transport.cancel_as_operator(LOCAL_WORKER, "short"))
        assert short.done.wait(30)
        assert answer == FINISHED_FIRST, answer
        assert short.event.finish_reason == "length", short.event

        host.add("long", "The list type", LONG, long)
        asyncio.run(asyncio.wait_for(_until_held(host, "long"), 30))
        assert asyncio.run(transport.cancel_as_operator(LOCAL_WORKER, "long")) is None
        assert long.done.wait(30) and long.event.finish_reason == "canceled", long.event
    finally:
        release.set()
        host.engine.step = real_step
        host.stop()


async def _until_held(host: EngineHost, request_id: str) -> None:
    while request_id not in host.snapshot.request_ids:
        await asyncio.sleep(0.01)
