"""The stream interval and gap (WORKBENCH_STREAM_INTERVAL, WORKBENCH_STREAM_GAP_MS): a request's deltas
gather N tokens, or wait until G ms passed since the last one, before they go out; its first tokens and
its last event go at once, and nothing is lost or reordered on the way: through the real engine thread,
on a cancel and an engine failure, while the request makes no tokens, and across processes to a Celery
worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import websockets

from engine import Engine, EngineConfig, SamplingParams
from tests.cluster import ROOT, Cluster
from tests.waiting import wait_until
from workbench.serving.engine_host import EngineHost
from workbench.serving.inprocess import InProcessTransport
from workbench.serving.stream_interval import DeltaHold
from workbench.serving.streams import StreamEvent

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


class Recorder:
    """A sink that keeps every event exactly as the engine thread released it (no consumer merging)."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []
        self.times: list[float] = []  # when each event was handed over
        self.done = threading.Event()

    def push_threadsafe(self, event: StreamEvent) -> None:
        self.events.append(event)
        self.times.append(time.monotonic())
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


GAP_S = 0.05


@pytest.fixture(scope="module")
def engine_threads():
    """An engine thread at each interval (1 is the control) and one with a gap, started once for the module."""
    threads = {n: EngineHost(lambda: Engine(EngineConfig(model="demo")), stream_interval=n) for n in (1, 4, 1000)}
    threads["gap"] = EngineHost(lambda: Engine(EngineConfig(model="demo")), stream_gap_s=GAP_S)
    for thread in threads.values():
        thread.start()
    yield threads
    for thread in threads.values():
        thread.stop()


def run(thread: EngineHost, prompts: list[str], params: SamplingParams = GREEDY) -> list[Recorder]:
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


HELD = 8  # tokens generated before the cancel or the failure: several steps the interval holds


def generated(thread: EngineHost, request_id: str) -> int:
    """The tokens `request_id` has so far, read from the test's thread while the engine's runs."""
    return sum(len(seq.output_ids) for seq in thread.engine.live_sequences() if seq.request_id == request_id)


def test_a_cancel_delivers_what_was_held(engine_threads):
    thread = engine_threads[1000]
    recorder = Recorder()
    params = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
    thread.add("cancel-me", "The list type", params, recorder)
    wait_until(lambda: recorder.events, timeout=30, what="the first delta")
    wait_until(lambda: generated(thread, "cancel-me") >= HELD, timeout=30, what=f"{HELD} tokens generated")
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
    wait_until(lambda: recorder.events, timeout=30, what="the first delta")
    wait_until(lambda: generated(thread, "fails") >= HELD, timeout=30, what=f"{HELD} tokens generated")
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


def test_deltas_go_out_no_closer_than_the_gap(engine_threads):
    prompts = ["The list type", "A dictionary is"]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    control = run(engine_threads[1], prompts, params)
    gapped = run(engine_threads["gap"], prompts, params)
    for every_step, spaced in zip(control, gapped):
        assert spaced.tokens == every_step.tokens and len(spaced.tokens) == 64, "same tokens, none lost"
        assert spaced.offsets_are_contiguous() and spaced.events[-1].finished
        assert len(spaced.events[0].token_ids) == 1, "the first token goes at once"
        # Between deltas (the last event goes at once, so it is left out); a little under the gap
        # because the hold decides before the step's deltas are handed over (and another thread can
        # hold the GIL between the two for up to its 5 ms switch interval).
        gaps = [b - a for a, b in zip(spaced.times[:-2], spaced.times[1:-1])]
        assert gaps and min(gaps) >= GAP_S * 0.8, gaps
        assert len(spaced.events) < len(every_step.events)
        # Liveness: without the gap the same request arrives one token per step, closer than the gap.
        assert [len(e.token_ids) for e in every_step.events] == [1] * 64
        assert min(b - a for a, b in zip(every_step.times, every_step.times[1:])) < GAP_S


def test_held_tokens_go_out_after_the_gap_while_the_request_makes_none(engine_threads):
    """A request the scheduler leaves waiting makes no deltas; what the gap held of it must still go
    out once the gap has passed, not wait for its next token. Simulated by keeping the request's
    engine outputs back for a while (they are handed over later, in order, so nothing is lost)."""
    thread = engine_threads["gap"]
    paused, busy = Recorder(), Recorder()
    kept_back: list = []
    pause_s = 0.6
    real_step = thread.engine.step

    def step_pausing_one_request():
        outputs = real_step()
        mine = [o for o in outputs if o.request_id == "paused"]
        if mine and (kept_back or mine[0].index >= 2):
            kept_back.extend(mine)  # from its third token on, the request seems to wait
            outputs = [o for o in outputs if o.request_id != "paused"]
        if kept_back and time.monotonic() - paused.times[0] > pause_s:
            outputs += kept_back  # it runs again: everything it made, in order
            kept_back.clear()
        return outputs

    thread.engine.step = step_pausing_one_request
    try:
        long = SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)  # to the model's length
        thread.add("busy", "A dictionary is", long, busy)  # keeps the engine stepping until canceled
        thread.add("paused", "The list type", SamplingParams(max_tokens=64, temperature=0, ignore_eos=True), paused)
        assert paused.done.wait(60)
        thread.cancel("busy")
        assert busy.done.wait(60)
    finally:
        thread.engine.step = real_step
    assert [len(e.token_ids) for e in paused.events[:2]] == [1, 1], "the first token, then the held second"
    assert paused.times[1] - paused.times[0] < pause_s / 2, "the held token went out after the gap, not after the pause"
    assert len(paused.tokens) == 64 and paused.offsets_are_contiguous()
    solo = run(engine_threads[1], ["The list type"], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))[0]
    assert paused.tokens == solo.tokens


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def delta(index: int, count: int = 1, finished: bool = False) -> StreamEvent:
    return StreamEvent(index=index, token_ids=list(range(index, index + count)), text="x" * count, finished=finished)


def test_the_gap_holds_until_it_has_passed_and_both_levers_must_agree():
    clock = Clock()
    hold = DeltaHold(interval=3, gap_s=0.02, clock=clock)
    assert hold.release("a", delta(0)).token_ids == [0], "the first token at once"
    clock.now += 0.03
    assert hold.release("a", delta(1)) is None, "the gap has passed but the interval has not"
    assert hold.release("a", delta(2)) is None
    assert hold.due() == [], "the sweep keeps to the interval too"
    sent = hold.release("a", delta(3))
    assert (sent.index, sent.token_ids) == (1, [1, 2, 3]), "both levers agree: the held tokens go, in order"
    clock.now += 0.01
    assert hold.release("a", delta(4, 3)) is None, "the interval is met, the gap not yet"
    assert hold.due() == []
    clock.now += 0.011
    [(request_id, swept)] = hold.due()
    assert (request_id, swept.index, swept.token_ids) == ("a", 4, [4, 5, 6]), "the sweep sends it once the gap passed"
    assert hold.due() == [], "and only once"
    last = hold.release("a", delta(7, finished=True))
    assert last.token_ids == [7] and last.finished, "the last event goes at once, gap or not"


def test_the_last_event_carries_what_the_gap_held():
    clock = Clock()
    hold = DeltaHold(gap_s=1.0, clock=clock)
    hold.release("a", delta(0))
    assert hold.release("a", delta(1)) is None and hold.release("b", delta(0)) is not None
    last = hold.release("a", delta(2, finished=True))
    assert (last.index, last.token_ids, last.text) == (1, [1, 2], "xx")
    assert hold.flush("a") is None, "nothing is left behind for it"


@pytest.mark.parametrize("interval", [0, -1, 2.5, "4", True])
def test_a_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match="stream interval"):
        DeltaHold(interval)


@pytest.mark.parametrize("gap", [-0.01, float("inf"), float("nan"), "0.02", True, None])
def test_a_bad_gap_is_refused(gap):
    with pytest.raises(ValueError, match="stream gap"):
        DeltaHold(gap_s=gap)


@pytest.mark.parametrize("name,value", [("WORKBENCH_STREAM_INTERVAL", v) for v in ["0", "four", "1.5", "", "99999"]]
                         + [("WORKBENCH_STREAM_GAP_MS", v) for v in ["-5", "20ms", "1e3", "", "10001", "nan"]])
def test_a_bad_setting_stops_the_process_with_its_name(name, value):
    result = subprocess.run([sys.executable, "-c", "import workbench.settings"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, name: value})
    assert result.returncode != 0 and f"{name} must be" in result.stderr


def test_a_good_gap_setting_reaches_the_settings_in_seconds():
    result = subprocess.run([sys.executable, "-c", "import workbench.settings as s; print(s.WORKBENCH_STREAM_GAP_S)"],
                            cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "WORKBENCH_STREAM_GAP_MS": "12.5"})
    assert result.stdout.strip() == "0.0125", result.stderr


STREAM_SETTINGS = {"interval": {"WORKBENCH_STREAM_INTERVAL": 4}, "gap": {"WORKBENCH_STREAM_GAP_MS": 1000}}


@pytest.fixture(scope="module")
def stream_clusters(tmp_path_factory) -> Iterator[dict[str, tuple[str, str]]]:
    """A worker and a Daphne for each of STREAM_SETTINGS, started side by side: (address, API token)."""
    from django.conf import settings

    clusters = {name: Cluster(settings.REDIS_URL, tmp_path_factory.mktemp(name), **setting)
                for name, setting in STREAM_SETTINGS.items()}

    def start(cluster: Cluster) -> tuple[str, str]:
        cluster.start_workers(1)
        return cluster.start_daphne(cluster.log_dir / "db.sqlite3")

    try:
        with ThreadPoolExecutor(len(clusters)) as pool:
            started = {name: pool.submit(start, cluster) for name, cluster in clusters.items()}
            yield {name: future.result() for name, future in started.items()}
    finally:
        for cluster in clusters.values():
            cluster.stop()


@pytest.mark.parametrize("setting", STREAM_SETTINGS)
def test_a_celery_worker_applies_its_stream_settings(stream_clusters, setting):
    """The settings are read where the engine runs: a worker started with one sends deltas of several
    tokens (4-token deltas; or, 1 s apart, what the steps made meanwhile) that reach a websocket client
    through Redis and Daphne whole and in order. A second is far longer than a step even on a loaded
    machine, so the gap's deltas hold several tokens whatever the machine's speed."""
    address, token = stream_clusters[setting]

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
    if setting == "interval":
        # The worker releases the first token at once, then every 4th, then the last; on the way a delta
        # merges into the one before it while that one's send is in flight (the worker's outbox, the web
        # side's stream), so the client's deltas end on those boundaries without ending on each.
        ends = {sum(sizes[: n + 1]) for n in range(len(sizes))}
        assert len(sizes) >= 2 and ends <= {1, *range(5, 24, 4), 24}, sizes
    else:
        assert sizes[0] == 1 and len(sizes) < 12 and max(sizes) >= 4, sizes
    assert [f["index"] for f in deltas] == [sum(sizes[:n]) for n in range(len(sizes))]


def sse_text_before_a_forward_error(thread: EngineHost) -> tuple[str, list[str]]:
    """Stream a completion over the OpenAI view's SSE generator while the engine's 4th forward fails."""
    from workbench.api.choice_streams import ChoiceGroup
    from workbench.api.openai import tool_calls
    from workbench.api.openai.views import SERVINGS, _Choice

    real_run, calls = thread.engine.runner.run, []

    def failing_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("injected forward failure")
        return real_run(*args, **kwargs)

    transport = InProcessTransport(thread, "demo")  # the view's transport, over this module's started host

    async def stream() -> list[str]:
        request_id = f"sse-{time.monotonic_ns()}"
        group = ChoiceGroup(transport, [request_id], [transport.submit(request_id, "The list type", GREEDY)])
        choices = [_Choice(request_id, transport.tokenizer, logprobs=False)]
        return [chunk async for chunk in SERVINGS["completion"].sse(group, choices,
                                                                    {"id": "x", "created": 0, "model": "m"}, False,
                                                                    tool_calls.Tools((), "none"))]

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
