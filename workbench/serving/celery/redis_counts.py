"""A user's request counts in Redis (workbench/serving/user_counts.py's interface), so that every web
process of a deployment on the Celery transport counts the same requests: with two Daphnes behind a
balancer a user still gets WORKBENCH_USER_CONCURRENT_REQUESTS at once, not twice that.

Per user, two sorted sets under the prefix:
- `<prefix>:limits:leases:<user>`: one member per request under way, its lease id, scored by the time
  the lease expires. A live request's web process renews its leases every third of the lease time
  (one thread per process, one script call for all its leases); a process that dies renews nothing, so
  its slots free themselves within WORKBENCH_LIMIT_LEASE_S and no counter is left behind.
- `<prefix>:limits:starts:<user>`: one member per request started, scored by when; the rate limit
  counts those of the last minute.
Acquiring is one Lua script: drop the expired leases and the starts older than the window, check both
limits, add the lease and the start. Times are the Redis server's (TIME), so web processes whose clocks
differ still agree. Both keys expire when unused, so an idle user leaves nothing in Redis.
"""

from __future__ import annotations

import logging
import threading
import redis

from workbench.serving.user_counts import WINDOW_S, Busy, Lease, TooFrequent, new_lease

log = logging.getLogger(__name__)

# KEYS: leases, starts. ARGV: lease id, lease ms, concurrency limit, rate limit, window ms.
# Returns {0, held} (acquired), {1, held} (busy) or {2, ms until the oldest start leaves the window}.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_ms, concurrent, per_minute, window_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window_ms)
local held = redis.call('ZCARD', KEYS[1])
if concurrent > 0 and held >= concurrent then return {1, held} end
if per_minute > 0 and redis.call('ZCARD', KEYS[2]) >= per_minute then
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {2, tonumber(oldest[2]) + window_ms - now}
end
redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease_ms)
redis.call('PEXPIRE', KEYS[2], window_ms)
return {0, held + 1}
"""

# KEYS: the leases sets, one per lease. ARGV: lease ms, then the lease ids in KEYS' order. Returns the
# ids no longer there. A lease already dropped (renewed too late) stays dropped: bringing it back could
# exceed the limit.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_ms = tonumber(ARGV[1])
local lost = {}
for i, key in ipairs(KEYS) do
    if redis.call('ZSCORE', key, ARGV[i + 1]) then
        redis.call('ZADD', key, 'XX', now + lease_ms, ARGV[i + 1])
        redis.call('PEXPIRE', key, lease_ms)
    else
        table.insert(lost, ARGV[i + 1])
    end
end
return lost
"""

_HELD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""


class RedisUserCounts:
    """The counts of every web process sharing `client`'s Redis and `prefix`."""

    def __init__(self, client: redis.Redis, prefix: str, lease_s: float) -> None:
        self._client, self._prefix, self.lease_s = client, prefix, lease_s
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._held = client.register_script(_HELD)
        self._lock = threading.Lock()
        self._live: dict[str, Lease] = {}  # this process's leases, by id: what the renewer renews
        self._renewer: threading.Thread | None = None
        self._stopped = threading.Event()

    def _key(self, kind: str, user: str) -> str:
        return f"{self._prefix}:limits:{kind}:{user}"

    def acquire(self, user: str, concurrent: int, per_minute: int) -> Lease | Busy | TooFrequent:
        lease = new_lease(user)
        outcome, value = self._acquire(
            keys=[self._key("leases", user), self._key("starts", user)],
            args=[lease.id, int(self.lease_s * 1000), concurrent, per_minute, int(WINDOW_S * 1000)])
        if outcome == 1:
            return Busy(int(value))
        if outcome == 2:
            return TooFrequent(int(value) / 1000)
        with self._lock:
            self._live[lease.id] = lease
            self._start_renewer()
        return lease

    def release(self, lease: Lease) -> None:
        with self._lock:
            self._live.pop(lease.id, None)
        self._client.zrem(self._key("leases", lease.user), lease.id)

    def in_flight(self, user: str) -> int:
        return int(self._held(keys=[self._key("leases", user)]))

    def reset(self) -> None:
        with self._lock:
            leases, self._live = list(self._live.values()), {}
        for lease in leases:
            self._client.zrem(self._key("leases", lease.user), lease.id)

    def renew(self) -> list[Lease]:
        """Renew every lease this process holds now; returns those Redis no longer held (their renewal
        came too late, or their keys were deleted), which this process stops renewing: they count
        nowhere now, and kept here they would be renewed in vain and warned about for as long as their
        requests run."""
        with self._lock:
            leases = list(self._live.values())
        if not leases:
            return []
        gone = {raw.decode() if isinstance(raw, bytes) else raw for raw in self._renew(
            keys=[self._key("leases", lease.user) for lease in leases],
            args=[int(self.lease_s * 1000), *(lease.id for lease in leases)])}
        lost = [lease for lease in leases if lease.id in gone]
        with self._lock:
            for lease in lost:
                self._live.pop(lease.id, None)
        return lost

    def renewing(self) -> int:
        """How many leases this process holds and renews."""
        with self._lock:
            return len(self._live)

    def stop(self) -> None:
        """Stop renewing (the leases then expire as a dead process's would); for tests and shutdown."""
        with self._lock:
            self._stopped.set()

    def _start_renewer(self) -> None:
        """Under self._lock. A renewer told to stop may not have seen it yet: the next one gets an event of
        its own, so the old one still stops and the new one runs."""
        if self._renewer is None or not self._renewer.is_alive() or self._stopped.is_set():
            self._stopped = threading.Event()
            self._renewer = threading.Thread(target=self._renew_until_stopped, args=(self._stopped,),
                                             name="limit-lease-renewer", daemon=True)
            self._renewer.start()

    def _renew_until_stopped(self, stopped: threading.Event) -> None:
        every = self.lease_s / 3  # two renewals may fail (a Redis blip) before a live lease expires
        while not stopped.wait(every):
            try:
                lost = self.renew()
                if lost:  # lost to a pause longer than the lease: no longer counted
                    log.warning("%d request leases expired before their renewal (users %s); no longer counted",
                                len(lost), ", ".join(sorted({lease.user for lease in lost})))
            except redis.RedisError as exc:
                log.warning("renewing the request leases failed: %s", exc)


def counts_for(redis_url: str, prefix: str, lease_s: float) -> RedisUserCounts:
    """This process's counts on `redis_url` under `prefix` (one per Redis, prefix and lease time)."""
    key = (redis_url, prefix, lease_s)
    with _COUNTS_LOCK:
        counts = _COUNTS.get(key)
        if counts is None:
            client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
            counts = _COUNTS[key] = RedisUserCounts(client, prefix, lease_s)
        return counts


_COUNTS_LOCK = threading.Lock()
_COUNTS: dict[tuple[str, str, float], RedisUserCounts] = {}


def reset_all() -> None:
    """Let go of every lease this process holds, in every Redis it counted in (a Redis that does not
    answer keeps them until they expire unrenewed)."""
    with _COUNTS_LOCK:
        every = list(_COUNTS.values())
    for counts in every:
        try:
            counts.reset()
        except redis.RedisError:
            pass
