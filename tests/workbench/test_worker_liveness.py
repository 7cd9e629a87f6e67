"""Worker liveness as the web side sees it, with real Celery worker processes on the machine's Redis and
the Celery transport's real web side in this process: a step that outlasts several heartbeats leaves
its worker alive and routed to, and a worker that is really gone (SIGKILL) is seen gone within the
grace periods docs/OPERATIONS.md states ("Worker liveness")."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings

from engine import SamplingParams
from tests.cluster import Cluster
from tests.waiting import wait_until
from workbench.serving.celery.link_settings import LinkSettings
from workbench.serving.celery.transport import CeleryTransport
from workbench.serving.streams import RequestStream, StreamEvent

pytestmark = pytest.mark.slow  # a worker process of its own per test

HEARTBEAT_S, LOST_S = 0.5, 2.0  # short, so the test is; the grace periods scale with them
STALL = "a stalled step"  # tests/fault_worker.py: the first forward of such a prompt keeps its engine busy
STALL_S = 3 * LOST_S  # past the key's lifetime: a heartbeat that waited for the step would let it expire
# What a loaded machine adds to the stated bounds: the web side's poll and this test's own watch run
# on threads that wait for a CPU like everything else here.
ALLOWANCE_S = 1.5


TESTS = ("stall", "kill")


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> Iterator[dict[str, tuple[Cluster, subprocess.Popen]]]:
    """For each of TESTS, a worker with the stall hook, beating every HEARTBEAT_S with keys that live LOST_S,
    under a queue prefix of its own (each test's web side sees only its worker; the second kills its).
    Both start side by side when the first test asks."""
    clusters = {name: Cluster(settings.REDIS_URL, tmp_path_factory.mktemp(name), app="tests.fault_worker",
                              WORKBENCH_HEARTBEAT_S=HEARTBEAT_S, WORKBENCH_WORKER_LOST_S=LOST_S,
                              FAULT_STALL=STALL, FAULT_STALL_S=STALL_S) for name in TESTS}
    try:
        with ThreadPoolExecutor(len(clusters)) as pool:
            started = {name: pool.submit(cluster.start_workers, 1) for name, cluster in clusters.items()}
            yield {name: (clusters[name], future.result()[0]) for name, future in started.items()}
    finally:
        for cluster in clusters.values():
            cluster.stop()


@contextmanager
def web_side(cluster: Cluster) -> Iterator[CeleryTransport]:
    transport = CeleryTransport(LinkSettings(model=settings.WORKBENCH_MODEL, redis_url=settings.REDIS_URL,
                                             queue_prefix=cluster.prefix, heartbeat_s=HEARTBEAT_S,
                                             lost_after_s=LOST_S))
    transport.start()
    try:
        yield transport
    finally:
        transport.stop()


def routed_to(transport: CeleryTransport, worker_id: str) -> bool:
    """Whether the web side would route a request to `worker_id` now (live, fresh, not draining)."""
    return worker_id in {beat.worker_id for beat in transport.roster.routable()}


async def last_event(stream: RequestStream) -> StreamEvent:
    async for event in stream:
        if event.finished:
            return event
    raise AssertionError("a stream ended without a last event")


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, seed=7, ignore_eos=True)


def test_a_step_that_outlasts_several_heartbeats_leaves_its_worker_alive(workers):
    cluster, worker = workers["stall"]
    worker_id = cluster.worker_id(worker)
    with web_side(cluster) as transport:
        wait_until(lambda: routed_to(transport, worker_id), timeout=30, what="the web side routing to the worker")

        async def run() -> tuple[list[tuple[float, bool, float]], StreamEvent, StreamEvent | None, float]:
            started = time.monotonic()
            stalled = transport.submit("stalled", f"{STALL}: the list type", greedy(4))
            stalled_end = asyncio.create_task(last_event(stalled))
            seen: list[tuple[float, bool, float]] = []  # (s since the submit, routed to, its heartbeat's sent_at)
            later_end = None
            while not stalled_end.done() and time.monotonic() - started < STALL_S + 60:
                beat = transport.workers().get(worker_id)
                seen.append((time.monotonic() - started, routed_to(transport, worker_id),
                             beat.sent_at if beat else 0.0))
                if later_end is None and time.monotonic() - started > 2 * LOST_S:
                    # Mid-stall: a new request goes to the busy worker (it waits for the step), not
                    # answered `unavailable` as if no worker were there.
                    later_end = asyncio.create_task(last_event(transport.submit("later", "A dictionary is",
                                                                                greedy(4))))
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            return seen, await stalled_end, await later_end if later_end else None, took

        seen, stalled, later, took = asyncio.run(run())

    assert "stalling the step" in Path(worker.log_path).read_text(), "liveness: the step stalled"
    unrouted = [round(t, 2) for t, routed, _ in seen if not routed]
    assert (stalled.finish_reason, stalled.error_code) == ("length", None), \
        f"the stalled request ended {stalled.error_code}: {stalled.error} (not routed to at {unrouted} s)"
    assert took >= STALL_S, "liveness: the step held the request for the whole stall"
    during = [s for s in seen if 0.5 <= s[0] <= STALL_S]
    assert during and not unrouted, f"the web side lost the worker while its step ran, at {unrouted} s"
    beats = {sent_at for _, _, sent_at in during}
    assert len(beats) >= STALL_S / (2 * HEARTBEAT_S), f"heartbeats went on during the step ({len(beats)} seen)"
    assert later is not None and (later.finish_reason, later.error_code) == ("length", None), later


def test_a_worker_gone_is_seen_gone_within_the_grace(workers):
    cluster, worker = workers["kill"]
    worker_id = cluster.worker_id(worker)
    with web_side(cluster) as transport:
        wait_until(lambda: routed_to(transport, worker_id), timeout=30, what="the web side routing to the worker")

        async def run() -> tuple[float, float, StreamEvent]:
            stream = transport.submit("doomed", "The list type", greedy(2000))
            first = await asyncio.wait_for(stream.next(), 60)
            assert first.token_ids and not first.finished, "liveness: the request runs on the worker"
            end = asyncio.create_task(last_event(stream))
            await asyncio.to_thread(cluster.kill, worker)  # SIGKILL: no drain, no retire, its key left to expire
            killed = time.monotonic()
            unrouted_after = None
            while not end.done() and time.monotonic() - killed < 30:
                if unrouted_after is None and not routed_to(transport, worker_id):
                    unrouted_after = time.monotonic() - killed
                await asyncio.sleep(0.02)
            event = await asyncio.wait_for(end, 1)
            lost_after = time.monotonic() - killed
            assert unrouted_after is not None, "the web side still routed to the killed worker"
            return unrouted_after, lost_after, event

        unrouted_after, lost_after, event = asyncio.run(run())

    assert event.error_code == "worker_lost", event
    assert unrouted_after <= 3 * HEARTBEAT_S + ALLOWANCE_S, f"routed to for {unrouted_after:.2f} s after its death"
    assert lost_after <= LOST_S + 1.0 + HEARTBEAT_S / 2 + ALLOWANCE_S, \
        f"its request ended worker_lost only {lost_after:.2f} s after the worker died"
