"""A user's request counts in Redis (workbench/serving/celery/redis_counts.py) on the machine's Redis:
acquiring is atomic, a live holder's lease is renewed, a killed holder's lease expires, and the limits
refuse with the words the in-memory counts use. Each test counts under a key prefix of its own."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from tests.waiting import wait_until
from workbench.serving import limits
from workbench.serving.celery.redis_counts import RedisUserCounts
from workbench.serving.user_counts import Busy, Lease, TooFrequent

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 1.0


@pytest.fixture
def prefix(settings):
    """A prefix of the test's own; every key under it is deleted afterwards."""
    name = f"test-leases-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield name
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def client(settings):
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)


HOLDER = """
import sys, time, redis
from workbench.serving.celery.redis_counts import RedisUserCounts
counts = RedisUserCounts(redis.Redis.from_url(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
lease = counts.acquire("holder-user", 2, 0)
print("held" if type(lease).__name__ == "Lease" else f"refused {lease}", flush=True)
time.sleep(600)
"""


def test_a_killed_holders_lease_expires_while_a_live_holders_is_renewed(settings, client, prefix):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, settings.REDIS_URL, prefix, str(LEASE_S)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        here = RedisUserCounts(client, prefix, LEASE_S)
        mine = here.acquire("holder-user", 2, 0)
        assert isinstance(mine, Lease)
        time.sleep(2 * LEASE_S)  # twice the lease: only renewal keeps either alive
        assert here.acquire("holder-user", 2, 0) == Busy(2), "both live holders' leases were renewed"

        holder.send_signal(signal.SIGKILL)  # no release, no renewal: what a web process that dies leaves
        holder.wait(timeout=10)
        time.sleep(1.5 * LEASE_S)
        assert here.in_flight("holder-user") == 1, "the killed holder's slot freed itself"
        again = here.acquire("holder-user", 2, 0)
        assert isinstance(again, Lease) and here.in_flight("holder-user") == 2
        assert client.zscore(f"{prefix}:limits:leases:holder-user", mine.id) is not None, "the live lease stays"
        here.release(mine)
        here.release(again)
        assert here.in_flight("holder-user") == 0
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_lease_whose_renewal_stops_expires(client, prefix):
    counts = RedisUserCounts(client, prefix, LEASE_S)
    lease = counts.acquire("quiet", 1, 0)
    assert isinstance(lease, Lease)
    counts.stop()
    time.sleep(1.5 * LEASE_S)
    assert counts.in_flight("quiet") == 0
    again = counts.acquire("quiet", 1, 0)
    assert isinstance(again, Lease)
    counts.release(again)
    assert counts.in_flight("quiet") == 0
    # The renewer that `again` started finds the lapsed lease gone and lets it go: nothing is left held.
    wait_until(lambda: counts.renewing() == 0, timeout=10 * LEASE_S, what="the lapsed lease let go")


def test_a_lease_lost_to_a_late_renewal_is_let_go_and_warned_about_once(client, prefix, caplog):
    counts = RedisUserCounts(client, prefix, LEASE_S)
    lost, kept = counts.acquire("lapsing", 2, 0), counts.acquire("lapsing", 2, 0)
    assert isinstance(lost, Lease) and isinstance(kept, Lease)
    # What a pause longer than the lease leaves in Redis: the lease expired, while its request runs on.
    client.zrem(f"{prefix}:limits:leases:lapsing", lost.id)
    with caplog.at_level(logging.WARNING, logger="workbench.serving.celery.redis_counts"):
        time.sleep(4 * LEASE_S / 3 + 0.2)  # four renewal periods: the warning would come at each
    warnings = [r.getMessage() for r in caplog.records if "expired before their renewal" in r.getMessage()]
    assert len(warnings) == 1, f"warned once, not at every renewal: {warnings}"
    assert warnings[0] == "1 request leases expired before their renewal (users lapsing); no longer counted"
    assert counts.renewing() == 1 and counts.in_flight("lapsing") == 1, "the live lease is renewed still"
    counts.release(lost)  # its request's end, later: harmless
    counts.release(kept)
    assert counts.renewing() == 0 and counts.in_flight("lapsing") == 0


def test_holders_racing_for_the_last_slots_get_exactly_the_limit(settings, prefix):
    # Eight web processes' worth of clients, each its own connection.
    holders = [RedisUserCounts(redis.Redis.from_url(settings.REDIS_URL), prefix, 30.0) for _ in range(8)]
    start = threading.Barrier(len(holders))
    outcomes: list[object] = []

    def race(counts: RedisUserCounts) -> None:
        start.wait()
        outcomes.extend(counts.acquire("racer", 3, 0) for _ in range(2))

    threads = [threading.Thread(target=race, args=(counts,)) for counts in holders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sum(isinstance(o, Lease) for o in outcomes) == 3 and len(outcomes) == 16
    assert all(o == Busy(3) for o in outcomes if not isinstance(o, Lease))
    for counts in holders:
        counts.reset()
    assert holders[0].in_flight("racer") == 0


def test_the_rate_counts_starts_in_the_window_across_releases(client, prefix):
    counts = RedisUserCounts(client, prefix, 30.0)
    for _ in range(2):
        lease = counts.acquire("steady", 0, 2)
        assert isinstance(lease, Lease)
        counts.release(lease)
    refused = counts.acquire("steady", 0, 2)
    assert isinstance(refused, TooFrequent) and 58 < refused.wait_s <= 60


@pytest.mark.parametrize("transport", ["inprocess", "celery"])
def test_both_counts_refuse_with_the_same_words(settings, prefix, transport):
    settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_LIMITS_PREFIX = transport, prefix
    settings.WORKBENCH_USER_CONCURRENT_REQUESTS, settings.WORKBENCH_USER_REQUESTS_PER_MINUTE = 1, 0
    limiter = limits.Limiter()
    first = limiter.admit("same-words")
    with pytest.raises(limits.Refused) as refused:
        limiter.admit("same-words")
    assert (refused.value.code, refused.value.message, refused.value.retry_after) == (
        "rate_limited", "you have 1 requests under way, the most one user may "
                        "(WORKBENCH_USER_CONCURRENT_REQUESTS); wait for one to end", 1)
    first.release()
    assert limiter.in_flight("same-words") == 0 and limiter.total == 0
    limiter.admit("same-words").release()  # liveness: the slot given back is there to take
