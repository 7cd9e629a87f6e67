"""The stream interval (WORKBENCH_STREAM_INTERVAL): a request's deltas gather N tokens before they go out,
its first tokens and its last event go at once, and nothing is lost or reordered on the way: through
the real engine thread, on a cancel and an engine failure, and across processes to a Celery worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import websockets

from engine import Engine, EngineConfig, SamplingParams
from tests.cluster import ROOT, Cluster
from workbench.serving.inprocess import EngineThread
from workbench.serving.stream_interval import DeltaHold
from workbench.serving.streams import StreamEvent

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


class Recorder:
    """A sink that keeps every event exactly as the engine thread released it (no consumer merging)."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []
        self.done = threading.Event()

    def push_threadsafe(self, event: StreamEvent) -> None:
        self.events.append(event)
        if event.finished:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    def offsets_are_contiguous(self) -> bool:
        offset = 0
        for event in self.events:
            if event.token_ids and event.index != offset:
                return False
            offset += len(event.token_ids)
        return True


@pytest.fixture(scope="module")
def engine_threads():
    """An engine thread at each interval (1 is the control), started once for the module."""
    threads = {n: EngineThread(lambda: Engine(EngineConfig(model="demo")), stream_interval=n) for n in (1, 4, 1000)}
    for thread in threads.values():
        thread.start()
    yield threads
    for thread in threads.values():
        thread.stop()


def run(thread: EngineThread, prompts: list[str], params: SamplingParams = GREEDY) -> list[Recorder]:
    recorders = [Recorder() for _ in prompts]
    for n, (prompt, recorder) in enumerate(zip(prompts, recorders)):
        thread.add(f"r{n}-{time.monotonic_ns()}", prompt, params, recorder)
    for recorder in recorders:
        assert recorder.done.wait(60), "the request finished"
    return recorders


def test_deltas_go_out_every_interval_after_the_first_tokens(engine_threads):
    prompts = ["The list type", "A dictionary is", "Each thread has"]
    control = run(engine_threads[1], prompts)
    batched = run(engine_threads[4], prompts)
    for every_step, every_four in zip(control, batched):
        assert every_four.tokens == every_step.tokens and len(every_four.tokens) == 24, "same tokens, none lost"
        # 1 token at once, then five deltas of 4 (21 tokens), then the last 3 with the finish.
        assert [len(e.token_ids) for e in every_four.events] == [1, 4, 4, 4, 4, 4, 3]
        assert every_four.events[-1].finished and every_four.events[-1].usage["completion_tokens"] == 24
        assert every_four.offsets_are_contiguous()
        # Liveness: at interval 1 the same request arrives one token per step.
        assert [len(e.token_ids) for e in every_step.events] == [1] * 24


def test_a_cancel_delivers_what_was_held(engine_threads):
    thread = engine_threads[1000]
    recorder = Recorder()
    params = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
    thread.add("cancel-me", "The list type", params, recorder)
    deadline = time.monotonic() + 30
    while not recorder.events and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)  # several steps whose tokens the interval holds
    thread.cancel("cancel-me")
    assert recorder.done.wait(30)
    last = recorder.events[-1]
    assert last.finish_reason == "canceled" and len(recorder.events) == 2, "first tokens, then all the rest at once"
    assert len(last.token_ids) > 0 and len(recorder.tokens) == last.usage["completion_tokens"]
    assert recorder.offsets_are_contiguous()


def test_an_engine_failure_delivers_what_was_held_before_the_error(engine_threads):
    thread = engine_threads[1000]
    recorder = Recorder()
    thread.add("fails", "The list type", SamplingParams(max_tokens=500, temperature=0, ignore_eos=True), recorder)
    deadline = time.monotonic() + 30
    while not recorder.events and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)
    real_step = thread.engine.step

    def broken_step():
        thread.engine.step = real_step  # once: the thread goes on serving afterwards
        raise RuntimeError("injected step failure")

    thread.engine.step = broken_step
    assert recorder.done.wait(30)
    assert recorder.events[-1].error_code == "engine_error"
    assert len(recorder.tokens) > 1, "the held tokens reached the client before the error"
    assert recorder.offsets_are_contiguous()
    solo = run(thread, ["The list type"], SamplingParams(max_tokens=len(recorder.tokens), temperature=0,
                                                           ignore_eos=True))[0]
    assert recorder.tokens == solo.tokens, "what was held is what the engine produced, in order"


@pytest.mark.parametrize("interval", [0, -1, 2.5, "4", True])
def test_a_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match="stream interval"):
        DeltaHold(interval)


@pytest.mark.parametrize("value", ["0", "four", "1.5", "", "99999"])
def test_a_bad_setting_stops_the_process_with_its_name(value):
    result = subprocess.run([sys.executable, "-c", "import workbench.settings"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "WORKBENCH_STREAM_INTERVAL": value})
    assert result.returncode != 0 and "WORKBENCH_STREAM_INTERVAL must be" in result.stderr


def test_a_celery_worker_applies_its_interval(tmp_path):
    """The setting is read where the engine runs: a worker started with it sends 4-token deltas that
    reach a websocket client through Redis and Daphne whole and in order."""
    from django.conf import settings

    cluster = Cluster(settings.REDIS_URL, tmp_path, WORKBENCH_STREAM_INTERVAL=4)
    try:
        cluster.start_workers(1)
        address, token = cluster.start_daphne(tmp_path / "db.sqlite3")

        async def ask() -> list[dict]:
            async with websockets.connect(f"ws://{address}/ws/v1/generate",
                                          additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                await ws.send(json.dumps({"type": "generate", "request_id": "a", "prompt": "The list type",
                                          "params": {"max_tokens": 24, "temperature": 0, "ignore_eos": True}}))
                frames = []
                while not frames or frames[-1]["type"] not in ("done", "error"):
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
                return frames

        frames = asyncio.run(ask())
        deltas = [f for f in frames if f["type"] == "delta"]
        sizes = [len(f["token_ids"]) for f in deltas]
        assert frames[-1]["type"] == "done" and sum(sizes) == 24
        assert sizes[0] == 1 and all(size >= 4 for size in sizes[1:-1]), sizes
        assert [f["index"] for f in deltas] == [sum(sizes[:n]) for n in range(len(sizes))]
    finally:
        cluster.stop()


def sse_text_before_a_forward_error(thread: EngineThread) -> tuple[str, list[str]]:
    """Stream a completion over the OpenAI view's SSE generator while the engine's 4th forward fails."""
    from workbench.api.openai_views import _sse

    real_run, calls = thread.engine.runner.run, []

    def failing_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("injected forward failure")
        return real_run(*args, **kwargs)

    async def stream() -> list[str]:
        events = thread.submit(f"sse-{time.monotonic_ns()}", "The list type", GREEDY)
        return [chunk async for chunk in _sse("completion", events, thread, {"id": "x", "created": 0, "model": "m"},
                                               False)]

    thread.engine.runner.run = failing_fourth
    try:
        chunks = asyncio.run(stream())
    finally:
        thread.engine.runner.run = real_run
    payloads = [json.loads(c[len("data: "):]) for c in chunks if c != "data: [DONE]\n\n"]
    text = "".join(p["choices"][0]["text"] for p in payloads if "choices" in p)
    return text, [p["error"]["code"] for p in payloads if "error" in p]


def test_sse_sends_the_held_text_before_a_forward_error(engine_threads):
    every_step = sse_text_before_a_forward_error(engine_threads[1])
    held = sse_text_before_a_forward_error(engine_threads[1000])
    assert every_step[1] == held[1] == ["engine_error"]
    assert len(every_step[0]) > 0 and held[0] == every_step[0], "the same text reaches the client either way"
