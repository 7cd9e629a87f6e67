"""A user's concurrent-request limit across two real Daphne processes over one Redis (the Celery
transport, on the session's two workers), as docker-compose runs several web instances behind a
balancer: the limit holds across both exactly, refused with the error one process gives, and a web
process that dies leaves no slot behind once its leases expire. The open-socket limit is counted the
same way, across both."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import websockets

from tests.cluster import start_daphne
from tests.workbench.test_hostile_input import until_done
from tests.workbench.test_limits import LONG, SHORT, answer, cancel, complete, connect, generate

pytestmark = pytest.mark.slow  # two Daphnes of their own on the session's Celery workers

LIMIT = 3
SOCKETS = 3
LEASE_S = 2.0
REFUSAL = {"code": "rate_limited", "retry_after": 1,
           "message": f"you have {LIMIT} requests under way, the most one user may "
                      "(WORKBENCH_USER_CONCURRENT_REQUESTS); wait for one to end"}


async def running(ws, request_id: str) -> str | dict:
    """Once the request's first tokens came, the word running: it holds its slot for real (the frames of
    other requests meanwhile are skipped; their `done` is still to come). Otherwise the frame that ended it."""
    first = await answer(ws, request_id)
    while first["type"] == "accepted":
        frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if frame.get("request_id") == request_id and frame["type"] != "accepted":
            return "running" if frame["type"] == "delta" else frame
    return first


async def routing(address: str) -> None:
    """Until the web process routes requests (GET /health answers 200). A second or two in which Redis
    answers nobody (seen on a loaded 2-core host: the workers' heartbeats and the web side's poll timed
    out together) leaves it without a fresh heartbeat for a moment, and a request sent then is refused
    `unavailable`, as it should be; the test's long requests must run."""
    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://{address}/health", timeout=5) as response:
                return response.status == 200
        except OSError:  # 503 (HTTPError) while no worker is routable, or no answer
            return False
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(healthy):
        assert time.monotonic() < deadline, f"{address} routed no request for 30 s"
        await asyncio.sleep(0.1)


async def first_accepted(ws, deadline_s: float) -> tuple[dict, float]:
    """Short requests tried every fifth of a second until one is accepted (and done: its slot is free
    again) or `deadline_s` passes: the last answer, and the seconds it took. (Polling, not one late try,
    keeps the time the long requests must outlast short.)"""
    started, attempts = time.monotonic(), itertools.count()
    while True:
        request_id = f"try{next(attempts)}"
        await generate(ws, request_id, SHORT)
        got = await answer(ws, request_id)
        if got["type"] == "accepted":
            await until_done(ws, request_id)
            return got, time.monotonic() - started
        if time.monotonic() - started > deadline_s:
            return got, time.monotonic() - started
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def two_daphnes(celery_cluster, tmp_path_factory):
    """Two Daphnes over the session's workers with a concurrency limit of LIMIT, counting under a key
    prefix of this module's run (so that parallel runs on one Redis count apart), each with a database
    of its own and user "bob" in both. Started side by side; yields a function returning both, alive:
    [(process, address, token)] * 2."""
    env = {**celery_cluster.env, "WORKBENCH_USER_CONCURRENT_REQUESTS": str(LIMIT),
           "WORKBENCH_USER_REQUESTS_PER_MINUTE": "0", "WORKBENCH_LIMIT_LEASE_S": str(LEASE_S),
           "WORKBENCH_USER_SOCKETS": str(SOCKETS),
           "WORKBENCH_LIMITS_PREFIX": f"test-limits-{uuid.uuid4().hex[:10]}"}
    root = tmp_path_factory.mktemp("two-daphnes")
    with ThreadPoolExecutor(2) as pool:
        servers = list(pool.map(lambda n: start_daphne(env, root / f"db{n}.sqlite3"), range(2)))

    def alive():
        """The servers, one that a test killed started again (on its database, a new address and token):
        each test finds both alive, in whatever order the tests run."""
        for n, (process, _, _) in enumerate(servers):
            if process.poll() is not None:
                servers[n] = start_daphne(env, root / f"db{n}.sqlite3")
        return list(servers)

    try:
        yield alive
    finally:
        for process, _, _ in servers:
            if process.poll() is None:
                process.terminate()
        for process, _, _ in servers:
            process.wait(timeout=10)


def test_a_users_concurrent_limit_holds_exactly_across_two_web_processes(two_daphnes):
    (_, first, first_token), (_, second, second_token) = two_daphnes()

    async def run():
        async with connect(first, first_token) as one, connect(second, second_token) as two:
            accepted = []
            for ws, request_id in ((one, "a1"), (two, "b1"), (one, "a2")):
                await generate(ws, request_id, LONG)
                accepted.append(await running(ws, request_id))
            refused = []
            for ws, request_id in ((two, "b2"), (one, "a3")):  # the N+1th, on either process
                await generate(ws, request_id, SHORT)
                refused.append(await answer(ws, request_id))
            with pytest.raises(openai.RateLimitError) as over_http:  # the same count on the other API
                await complete(second, second_token)
            canceled = await cancel(one, "a1")
            await generate(two, "b3", SHORT)  # the slot freed on the first process, taken on the second
            freed = await answer(two, "b3")
            ends = [await cancel(ws, request_id) for ws, request_id in ((two, "b1"), (one, "a2"))]
            await cancel(two, "b3")
            return accepted, refused, over_http.value, canceled, freed, ends

    accepted, refused, over_http, canceled, freed, ends = asyncio.run(run())
    assert accepted == ["running"] * LIMIT, "N requests across the two processes are taken"
    assert refused == [{"type": "error", "request_id": "b2", **REFUSAL}, {"type": "error", "request_id": "a3", **REFUSAL}]
    assert over_http.status_code == 429 and over_http.body["code"] == "rate_limited"
    assert canceled["finish_reason"] == "canceled" and freed["type"] == "accepted"
    assert [end.get("finish_reason") for end in ends] == ["canceled"] * 2, \
        f"the others held their slots throughout: their cancels answered {ends}"


def test_a_web_process_that_dies_frees_its_slots_once_its_leases_expire(two_daphnes):
    (_, first, first_token), (dying, second, second_token) = two_daphnes()

    async def run():
        async with connect(first, first_token) as one:
            for request_id in ("k1", "k2"):
                await generate(one, request_id, LONG)
                assert await running(one, request_id) == "running"
            async with connect(second, second_token) as two:
                await generate(two, "d1", LONG)
                assert await running(two, "d1") == "running"
                dying.send_signal(signal.SIGKILL)  # no release, no renewal from here on
                dying.wait(timeout=10)
            await generate(one, "k3", SHORT)
            still_held = await answer(one, "k3")  # liveness: the dead process's lease still counts at first
            freed, after_s = await first_accepted(one, LEASE_S + 30)
            await routing(first)
            await generate(one, "k4", LONG)  # the freed slot; k1 and k2 still hold theirs, renewed
            taken = await running(one, "k4")
            await generate(one, "k5", SHORT)
            over = await answer(one, "k5")
            ends = [await cancel(one, request_id) for request_id in ("k1", "k2", "k4")]
            return still_held, freed, after_s, taken, over, ends

    still_held, freed, after_s, taken, over, ends = asyncio.run(run())
    assert still_held == {"type": "error", "request_id": "k3", **REFUSAL}
    assert freed["type"] == "accepted", f"the dead process's slot was still held {after_s:.1f} s on"
    assert taken == "running" and over == {"type": "error", "request_id": "k5", **REFUSAL}, \
        f"only the dead process's slot freed: the live one's leases outlived theirs, renewed ({taken}, {over})"
    assert [end.get("finish_reason") for end in ends] == ["canceled"] * 3, \
        f"the long requests ran throughout (else a slot freed may have been theirs): their cancels answered {ends}"


def test_a_users_open_sockets_are_counted_across_two_web_processes(two_daphnes):
    """Two sockets on one process and one on the other are the user's three; a fourth is refused on
    either, and one closed on the first makes room on the second."""
    (_, first, first_token), (_, second, second_token) = two_daphnes()

    async def refusal(address: str, token: str) -> tuple[str, int | None]:
        async with connect(address, token) as extra:
            code = json.loads(await asyncio.wait_for(extra.recv(), 30))["code"]
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(extra.recv(), 30)
            return code, extra.close_code

    async def answered(ws) -> str:
        await ws.send(json.dumps({"type": "cancel", "request_id": "none"}))
        return json.loads(await asyncio.wait_for(ws.recv(), 30))["code"]

    async def run():
        held = [await connect(first, first_token).__aenter__(), await connect(first, first_token).__aenter__(),
                await connect(second, second_token).__aenter__()]
        try:
            alive = [await answered(ws) for ws in held]
            refused = [await refusal(second, second_token), await refusal(first, first_token)]
            await held.pop(0).close()
            await asyncio.sleep(0.5)  # the first process hears the close and gives the place back
            async with connect(second, second_token) as again:
                room = await answered(again)
            return alive, refused, room
        finally:
            for ws in held:
                await ws.close()

    alive, refused, room = asyncio.run(run())
    assert alive == ["unknown_request_id"] * SOCKETS, "liveness: the user's sockets are open and answered"
    assert refused == [("too_many_sockets", 4429)] * 2, "a fourth socket, on either process"
    assert room == "unknown_request_id", "the place given back on one process is free on the other"
