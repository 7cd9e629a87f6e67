"""bench/load.py at a small size on the session's shared Daphnes (docs/TESTING.md), both transports, with
the device loop and graphs switched on for the run over the dashboard socket (as an operator does) and
off again after (as the servers start): four clients on both APIs, greedy and seeded, reading,
canceling, dropping their connections and reading slowly; every answer matches its solo run (or a
logged near-tie) or is a prefix of it, every delta's offset continues the last, every client is
answered, and the engines show the flags in force and that the loop burst and graphs replayed meanwhile.
Then a short soak on the in-process Daphne: every idle checkpoint stays flat (bench/soak.py)."""

from __future__ import annotations

import asyncio

import pytest

from bench import soak
from bench.load_clients import load, specs
from bench.load_clients import soak as soak_load
from bench.load_oracle import judge, solo
from bench.load_stack import (DEVICE_LOOP, GRAPHS, OPERATOR, Target, engines, engines_after, runtime_check, set_flags,
                              wait_healthy)
from engine import Engine, EngineConfig
from tests.cluster import issue_tokens, operator_session

pytestmark = pytest.mark.slow  # real Daphnes (shared by the session), real Celery workers, real clients

USERS = ["load0", "load1", "load2", "load3"]  # users of these tests alone on the shared servers
SEED = 12  # with MAX_TOKENS: a plan with every behaviour: read, cancel and drop on both APIs, a slow reader
MAX_TOKENS = 12
# Three in four greedy: the loop bursts only an all-greedy decode batch, which the issue's half-and-half
# mix seldom gives four clients.
GREEDY_SHARE = 0.75
SOAK_S, SOAK_INTERVAL_S = 12.0, 3.0


@pytest.fixture(scope="module")
def reference():
    """One eager engine for every solo run of the module."""
    return Engine(EngineConfig(model="demo"))


def target_on(request, transport: str) -> Target:
    served = request.getfixturevalue(f"{transport}_daphne")
    tokens = issue_tokens(served.env, served.db_path, USERS)
    session = operator_session(served.env, served.db_path, username=OPERATOR)[0]
    wait_healthy(served.address)  # the transport started: /metrics names its workers
    if transport == "inprocess":
        return Target(transport, served.address, tokens, session)
    return Target(transport, served.address, tokens, session, served.env["REDIS_URL"],
                  served.env["WORKBENCH_QUEUE_PREFIX"])


@pytest.mark.parametrize("transport", ["inprocess", "celery"])
def test_a_small_load_with_the_device_loop_on_answers_everyone_with_their_own_tokens(request, transport, reference):
    target = target_on(request, transport)
    plan = specs(len(USERS), 3, USERS, SEED, MAX_TOKENS, greedy_share=GREEDY_SHARE)
    switched = asyncio.run(set_flags(target, {DEVICE_LOOP: True, GRAPHS: True}))
    try:
        assert all(frame["type"] == "flag_result" for frame in switched.values()), switched
        before = asyncio.run(engines(target))
        results = asyncio.run(load(target.address, target.tokens, plan))
        after = asyncio.run(engines_after(target, before))
    finally:
        asyncio.run(set_flags(target, {DEVICE_LOOP: False, GRAPHS: False}))
    lines, ok = runtime_check(before, after, device_loop=True, graphs=True)
    assert ok, "\n".join(lines)  # in force on every worker before and after, and the loop burst, graphs replayed
    report = judge(results, solo([spec for mine in plan for spec in mine], engine=reference))
    assert report["requests"] == 12 and report["unanswered"] == 0, report
    assert report["mismatches"] == [] and report["offset_gaps"] == 0, report
    # Liveness: the oracle compared whole answers, not only prefixes, and every behaviour ran.
    assert report["endings"].get("done", 0) >= 2 and {"canceled", "dropped"} <= set(report["endings"]), report
    assert set(report["endings"]) <= {"done", "canceled", "dropped"}, report


def test_a_short_soak_stays_flat(request, reference):
    target = target_on(request, "inprocess")
    plans = [specs(len(USERS), 2, USERS, SEED + k, MAX_TOKENS, first_number=100 * k) for k in range(2)]
    points: list[soak.Checkpoint] = []

    async def checkpoint() -> None:
        idle = await soak.quiesce(target)
        points.append(await asyncio.to_thread(soak.sample, target, 0.0, idle))

    async def run():
        await checkpoint()
        return await soak_load(target.address, target.tokens, plans, SOAK_S, SOAK_INTERVAL_S, checkpoint)

    results = asyncio.run(run())
    rows = soak.verdict(points)
    assert all(row["flat"] for row in rows), rows
    # Liveness: the checkpoints measured the web process and the engine, and the load ran between them.
    assert len(points) >= 4 and {"web rss_mib", "web fds", "web connections"} <= {row["measure"] for row in rows}, rows
    assert any("kv blocks" in row["measure"] for row in rows), rows
    report = judge(results, solo([spec for plan in plans for mine in plan for spec in mine], engine=reference))
    assert report["requests"] >= 8 and report["unanswered"] == 0, report
    assert report["mismatches"] == [] and report["offset_gaps"] == 0, report
