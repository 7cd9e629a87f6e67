"""The Celery transport with real worker processes over a real Redis: spreading, cancel to the right
worker, no worker or every worker full, a task delivered twice still running once, and a worker's warm
shutdown. A worker killed mid-stream and Redis stopped and started are test_faults.py's (twice each, with
the chat's stored reply and every request checked against its solo run)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from contextlib import contextmanager

import pytest
import redis
from django.conf import settings
from django.test import AsyncClient

from engine import SamplingParams
from tests.cluster import Cluster
from tests.reference import greedy_solo
from tests.workbench.test_websocket_api import (MAX_TOKENS_AFTER_CANCEL, connect, frames_until_done,
                                                 wait_for)
from workbench.celery import app as celery_app
from workbench.serving import bridge
from workbench.serving.celery import wire
from workbench.serving.celery.redis_layer import make_layer
from workbench.serving.streams import StreamEvent
from workbench.serving.transport import FINISHED_FIRST

pytestmark = pytest.mark.django_db(transaction=True)
PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of",
           "If the file does not exist,", "The default value is"]


@contextmanager
def served_by(cluster: Cluster):
    """This process's web side talks to `cluster` (its own queue prefix) for the test's duration."""
    saved = settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX
    bridge.shutdown()
    settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX = "celery", cluster.prefix
    try:
        yield bridge.transport()
    finally:
        settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX = saved  # first: nothing may skip it
        bridge.shutdown()


class DirectTasks:
    """Tasks sent straight to the cluster's one worker, as a web process would send them, with a reply
    channel of the test's own: for what no well-behaved web process sends."""

    def __init__(self, transport) -> None:
        self.worker = next(iter(transport.workers().values()))
        self.layer = make_layer(settings.REDIS_URL)

    async def __aenter__(self) -> "DirectTasks":
        self.reply = await self.layer.new_channel()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.layer.close_pools()

    def send(self, requests: list) -> None:
        celery_app.send_task(wire.GENERATE_TASK, args=[requests, self.reply], queue=self.worker.queue)

    async def receive(self, timeout: float = 10) -> list[tuple[str, StreamEvent]]:
        return wire.events_of(await asyncio.wait_for(self.layer.receive(self.reply), timeout))


def generate(request_id: str, prompt: str, max_tokens: int | None) -> str:
    return json.dumps({"type": "generate", "request_id": request_id, "prompt": prompt,
                       "params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})


def tokens_of(frames: list[dict], request_id: str) -> list[int]:
    return [t for f in frames if f.get("request_id") == request_id and f["type"] == "delta" for t in f["token_ids"]]


async def both_workers_idle(transport) -> None:
    """Wait until this web side's roster shows two workers holding nothing: then two requests sent
    together go one to each (the least loaded is chosen, and the first one sent counts at once). A
    heartbeat can still list a request the test before just finished, and the two would then share
    the other worker."""
    def idle() -> bool:
        beats = transport.workers().values()
        return len(beats) == 2 and not any(beat.requests for beat in beats)
    assert await wait_for(idle), {worker: beat.requests for worker, beat in transport.workers().items()}


def holder(transport, engine_id_fragment: str) -> str | None:
    for worker_id, beat in transport.workers().items():
        if any(engine_id_fragment in rid for rid in beat.requests):
            return worker_id
    return None


@pytest.mark.asyncio
async def test_requests_spread_over_two_workers_and_each_matches_its_solo_run(api_user, celery_cluster):
    with served_by(celery_cluster):
        ws = await connect(api_user[1])
        for i, prompt in enumerate(PROMPTS):
            await ws.send_to(text_data=generate(f"r{i}", prompt, 24))
        frames = await frames_until_done(ws, {f"r{i}" for i in range(len(PROMPTS))})
        for i, prompt in enumerate(PROMPTS):
            assert tokens_of(frames, f"r{i}") == greedy_solo(prompt, 24), f"r{i} differs from its solo run"
        admitted = {rid: workers for rid, workers in celery_cluster.admissions().items()
                    if re.search(r"-r\d+\.", rid)}
        assert len(admitted) == len(PROMPTS) and all(len(w) == 1 for w in admitted.values())
        per_worker = {w[0] for w in admitted.values()}
        assert len(per_worker) == 2, f"all on one worker: {admitted}"
        await ws.disconnect()


@pytest.mark.asyncio
async def test_requests_that_arrive_together_share_tasks_and_each_gets_its_own_tokens(celery_cluster):
    from celery import signals

    tasks = []

    def published_task(body=None, **kwargs):
        tasks.append(body)

    signals.before_task_publish.connect(published_task, weak=False)
    try:
        with served_by(celery_cluster) as transport:
            params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
            prompts = PROMPTS * 3
            streams = [transport.submit(f"burst-{i}", prompt, params) for i, prompt in enumerate(prompts)]

            async def tokens_of_stream(stream) -> list[int]:
                return [token for event in [event async for event in stream] for token in event.token_ids]

            results = await asyncio.wait_for(asyncio.gather(*map(tokens_of_stream, streams)), 60)
    finally:
        signals.before_task_publish.disconnect(published_task)
    for prompt, tokens in zip(prompts, results):
        assert tokens == greedy_solo(prompt, 12)
    published = [request["request_id"] for body in tasks for request in body[0][0]]
    assert sorted(published) == sorted(set(published)) and len(published) == len(prompts), "each sent once"
    assert len(tasks) < len(prompts), "requests that arrived together travel together"


@pytest.mark.asyncio
async def test_a_malformed_request_in_a_task_keeps_no_other_out(celery_cluster):
    with served_by(celery_cluster) as transport:
        async with DirectTasks(transport) as tasks:
            params = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
            good = {"request_id": "after-junk", "prompt": "The list type", "params": params}
            tasks.send(["junk", {"prompt": "x"}, good])
            tokens = []
            while len(tokens) < 4:
                for request_id, event in await tasks.receive():
                    assert request_id == "after-junk"
                    tokens += event.token_ids
        assert tokens == greedy_solo("The list type", 4)


@pytest.mark.asyncio
async def test_a_cancel_reaches_the_worker_that_holds_the_request(api_user, celery_cluster):
    """The cancel goes out as soon as the request to be stopped streams, not once the heartbeats list it:
    on a busy host the roster can lag by a second or more, and the demo model's whole reply takes a few.
    Which worker held each request is read from the workers' logs afterwards."""
    with served_by(celery_cluster) as transport:
        await both_workers_idle(transport)
        admitted_before = celery_cluster.admissions()
        ws = await connect(api_user[1])
        await ws.send_to(text_data=generate("keep", "x", 300))
        await ws.send_to(text_data=generate("stop", "x", None))  # to the model's length: runs until canceled
        before = await frames_until_first_delta(ws, "stop")
        await ws.send_to(text_data=json.dumps({"type": "cancel", "request_id": "stop"}))
        frames = before + await frames_until_done(ws, {"keep", "stop"})
        done = {f["request_id"]: f for f in frames if f["type"] == "done"}
        assert done["stop"]["finish_reason"] == "canceled"
        after_cancel = done["stop"]["usage"]["completion_tokens"] - len(tokens_of(before, "stop"))
        assert after_cancel <= MAX_TOKENS_AFTER_CANCEL, f"{after_cancel} tokens came after the cancel"
        assert done["keep"]["finish_reason"] == "length" and tokens_of(frames, "keep") == greedy_solo("x", 300)
        admitted = {wire_id: workers for wire_id, workers in celery_cluster.admissions().items()
                    if wire_id not in admitted_before}
        [keep_worker] = [w for wire_id, [w] in admitted.items() if "-keep." in wire_id]
        [stop_worker] = [w for wire_id, [w] in admitted.items() if "-stop." in wire_id]
        assert keep_worker != stop_worker, "liveness: the two requests run on different workers"
        cancels = {celery_cluster.worker_id(p): [line for line in open(p.log_path) if "cancel " in line]
                   for p in celery_cluster.workers}
        assert any("-stop." in line for line in cancels[stop_worker])
        assert not any("-stop." in line for line in cancels[keep_worker])
        await ws.disconnect()


async def frames_until_first_delta(ws, request_id: str) -> list[dict]:
    """The frames up to and including `request_id`'s first tokens."""
    frames: list[dict] = []
    while not tokens_of(frames, request_id):
        frames.append(json.loads(await ws.receive_from(timeout=30)))
    return frames


@pytest.mark.asyncio
async def test_an_operators_audit_pick_reaches_the_worker_that_holds_the_request(api_user, celery_cluster):
    """The worker that served the picked request re-runs it and counts it equal; the other audits nothing
    (the suite's random audit share is 0, so the other worker's finished request is the control).
    An operator picks from what the heartbeats list, which can lag by a second or more on a busy host:
    300 tokens keep both requests running for a few seconds."""
    with served_by(celery_cluster) as transport:
        await both_workers_idle(transport)
        ws = await connect(api_user[1])
        await ws.send_to(text_data=generate("picked", "x", 300))
        await ws.send_to(text_data=generate("other", "x", 300))
        assert await wait_for(lambda: holder(transport, "-picked") and holder(transport, "-other"))
        picked_worker, other_worker = holder(transport, "-picked"), holder(transport, "-other")
        assert picked_worker != other_worker, "liveness: the two requests run on different workers"
        wire_id = next(rid for rid in transport.workers()[picked_worker].requests if "-picked" in rid)
        assert await transport.audit_as_operator(other_worker, wire_id) == \
            "no such request on this worker (it may have just finished)"
        assert await transport.audit_as_operator(picked_worker, wire_id) is None
        await frames_until_done(ws, {"picked", "other"})

        def audited(worker: str) -> tuple[int, int]:
            metrics = transport.metrics_by_worker().get(worker)
            return (metrics["replay_audited"], metrics["replay_audit_equal"]) if metrics else (0, 0)
        # The audit re-runs the 300 tokens after the reply ends: seconds on a busy host.
        assert await wait_for(lambda: audited(picked_worker) == (1, 1), timeout=20), audited(picked_worker)
        assert audited(other_worker) == (0, 0)
        [process] = [p for p in celery_cluster.workers if celery_cluster.worker_id(p) == picked_worker]
        assert any(wire_id in line for line in open(process.log_path) if "an operator's pick" in line)
        await ws.disconnect()


@pytest.mark.asyncio
async def test_an_operators_cancel_is_answered_by_the_worker_that_held_the_request(api_user, celery_cluster):
    """The worker answers once its engine has applied the cancel: None for a request it still ran, which
    ends canceled; for one its engine no longer holds, that nothing was canceled. Both are asked past the
    roster's check (the web side's copy of the heartbeats, which can list a request for a second after it
    ended), at the request's first delta and again after its end."""
    with served_by(celery_cluster) as transport:
        ws = await connect(api_user[1])
        await ws.send_to(text_data=generate("stopped", "x", None))  # to the model's length: runs until canceled
        await frames_until_first_delta(ws, "stopped")
        [(wire_id, [worker])] = [(w, workers) for w, workers in celery_cluster.admissions().items() if "-stopped." in w]

        async def operator_cancel() -> str | None:
            asked = transport._cancels.cancel(worker, wire_id, transport.reply_channel)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(asked, transport._loop))
        assert await operator_cancel() is None
        assert (await frames_until_done(ws, {"stopped"}))[-1]["finish_reason"] == "canceled"
        assert await operator_cancel() == FINISHED_FIRST
        await ws.disconnect()


async def openai_completion(token: str):
    return await AsyncClient().post("/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 4, "seed": 0},
                                    content_type="application/json", headers={"Authorization": f"Bearer {token}"})


@pytest.mark.asyncio
async def test_no_worker_gives_unavailable_and_full_workers_give_overloaded(api_user, tmp_path):
    cluster = Cluster(settings.REDIS_URL, tmp_path, WORKBENCH_WORKER_CAPACITY=1)
    try:
        with served_by(cluster) as transport:
            params = SamplingParams(max_tokens=2000, ignore_eos=True, seed=0)
            nobody = await transport.submit("n1", "x", params).next()
            assert nobody.finished and nobody.error_code == "unavailable"
            response = await openai_completion(api_user[1])
            assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"
            await asyncio.to_thread(cluster.start_workers, 1)
            assert await wait_for(lambda: transport.workers(), timeout=10)
            first = transport.submit("f1", "x", params)
            assert (await first.next()).token_ids, "liveness: the worker serves one"
            second = await transport.submit("f2", "x", params).next()
            assert second.finished and second.error_code == "overloaded"
            response = await openai_completion(api_user[1])
            assert response.status_code == 503 and response.json()["error"]["code"] == "overloaded"
            transport.cancel("f1")
            async for event in first:
                pass
            assert event.finish_reason == "canceled"
    finally:
        cluster.stop()


@pytest.mark.asyncio
async def test_the_prompt_stays_out_of_the_task_headers(celery_cluster):
    """Celery shows a task's argsrepr header in logs, events and monitors: never the user's prompt."""
    from celery import signals

    published = []

    def seen(sender=None, headers=None, body=None, **kwargs):
        published.append((headers, body))

    signals.before_task_publish.connect(seen, weak=False)
    try:
        with served_by(celery_cluster) as transport:
            params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
            stream = transport.submit("private", "my bank password is hunter2", params)
            async for event in stream:
                pass
    finally:
        signals.before_task_publish.disconnect(seen)
    assert event.finish_reason == "length"
    [(headers, body)] = published
    assert "hunter2" in json.dumps(body), "liveness: the prompt travels in the body"
    assert "hunter2" not in json.dumps(headers) and "private" in headers["argsrepr"]


@pytest.mark.asyncio
async def test_a_garbled_message_on_the_reply_channel_costs_no_other_request(celery_cluster):
    """Whatever lands on a web process's reply channel (a worker of another version, a stray sender),
    its reading must not stop the relay that carries every request's tokens there."""
    with served_by(celery_cluster) as transport:
        layer = make_layer(settings.REDIS_URL)
        for garbled in ({"type": wire.EVENTS, "events": [{"index": "zero"}]}, {"type": wire.EVENTS, "events": 7}):
            await layer.send(transport.reply_channel, garbled)
        await layer.close_pools()
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

        async def collect() -> tuple[list[int], StreamEvent]:
            tokens = []
            async for event in transport.submit("after", "The list type", params):
                tokens += event.token_ids
            return tokens, event

        tokens, event = await asyncio.wait_for(collect(), 30)  # a dead relay would leave it hanging
        assert event.finish_reason == "length" and tokens == greedy_solo("The list type", 8)


@pytest.mark.asyncio
async def test_a_task_delivered_twice_runs_once(celery_cluster):
    """The worker refuses a request id it admitted before, so a redelivered task never runs again."""
    with served_by(celery_cluster) as transport:
        async with DirectTasks(transport) as tasks:
            params = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
            for _ in range(2):
                tasks.send([{"request_id": "twice-1", "prompt": "The list type", "params": params}])
            tokens, finished = [], 0
            while finished < 1:
                for request_id, event in await tasks.receive():
                    assert request_id == "twice-1" and event.index == len(tokens)
                    tokens += event.token_ids
                    finished += event.finished
            with pytest.raises(asyncio.TimeoutError):
                await tasks.receive(timeout=2)  # nothing from a second run
        assert tokens == greedy_solo("The list type", 8)
        assert celery_cluster.admissions()["twice-1"] == [tasks.worker.worker_id]


@pytest.mark.asyncio
async def test_a_worker_stopped_with_sigterm_finishes_what_it_holds_and_takes_nothing_new(tmp_path):
    cluster = Cluster(settings.REDIS_URL, tmp_path, WORKBENCH_DRAIN_S=20)
    try:
        [worker] = await asyncio.to_thread(cluster.start_workers, 1)
        with served_by(cluster) as transport:
            params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
            held = transport.submit("held", "The list type", params)
            first = await held.next()
            assert first.token_ids, "liveness: it runs"
            [queue] = [beat.queue for beat in transport.workers().values()]
            redis_client = redis.Redis.from_url(settings.REDIS_URL)
            assert redis_client.keys(f"_kombu.binding*{queue}"), "liveness: kombu keeps the queue's binding"

            def bound_to_default_exchange() -> list[bytes]:
                members = redis_client.smembers(f"_kombu.binding.{cluster.prefix}.unrouted")
                return [member for member in members if queue.encode() in member]

            assert bound_to_default_exchange(), "liveness: and the worker's own binding"
            worker.send_signal(signal.SIGTERM)
            assert await wait_for(lambda: any(b.draining for b in transport.workers().values()), timeout=5)
            refused = await transport.submit("late", "x", params).next()
            assert refused.error_code == "unavailable", "a draining worker takes nothing new"
            tokens, event = list(first.token_ids), first
            async for event in held:
                tokens += event.token_ids
            assert event.finish_reason == "length" and tokens == greedy_solo("The list type", 200)
            await asyncio.to_thread(worker.wait, 30)
            assert worker.returncode == 0
            assert not redis_client.keys(f"*{queue}*"), "its queue and kombu's keys for it go with the worker"
            assert not bound_to_default_exchange(), "nor its member in the default exchange's bindings"
    finally:
        cluster.stop()
