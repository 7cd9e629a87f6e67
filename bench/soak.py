"""The soak's samples and its verdict (bench/load.py --soak).

A checkpoint is taken with the stack idle: the clients pause between requests (bench/load_clients.py
`soak`), then `quiesce` waits until no worker runs or queues a request (a dropped or canceled request
still running would show here), then `sample` reads, for the web process and every Celery worker: RSS,
open file descriptors and open inet connections; per worker the KV cache's share of blocks in use
(/metrics: blocks some sequence holds; idle cached prefixes count as free); and the Redis keys that are
the stack's, split into keys that never expire and keys with a TTL (the admitted-request marks live
ADMITTED_MEMORY_S, by design).

"Flat" (`verdict`): the first checkpoint after the first interval is the baseline (before it the
engine warms up: graph capture, allocator arenas, imports on first use); every later checkpoint must
stay within a tolerance of it:
- RSS: at most max(RSS_SLACK_MIB, RSS_SLACK_SHARE x baseline) above it;
- file descriptors and connections: at most HANDLE_SLACK above it (a socket in its last moments);
- KV blocks in use: none more than the baseline (idle means none held);
- Redis keys that never expire: none more than the baseline; a key with a TTL must expire within
  ADMITTED_MEMORY_S (+ slack), so those are bounded by time, not judged by count;
- every checkpoint idle within QUIESCE_S, every process of the baseline still there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import psutil
import redis

from bench.load_stack import Target, metrics, processes
from workbench.serving.celery.presence import ADMITTED_MEMORY_S

RSS_SLACK_MIB = 24.0
RSS_SLACK_SHARE = 0.05
HANDLE_SLACK = 4
TTL_SLACK_S = 60
QUIESCE_S = 30.0


@dataclass
class Checkpoint:
    at_s: float  # since the soak started
    idle: bool  # nothing running or waiting on any worker when sampled
    processes: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> rss_mib, fds, connections
    kv_usage: dict[str, float] = field(default_factory=dict)  # worker -> share of KV blocks in use
    redis: dict[str, int] | None = None  # persistent, expiring, longest_ttl_s (None: no Redis)


async def quiesce(target: Target, timeout: float = QUIESCE_S) -> bool:
    """Wait until no worker runs or queues a request; False if that did not happen within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = await asyncio.to_thread(metrics, target.address)
        if seen and all(m.get("running", 0) + m.get("waiting", 0) == 0 for m in seen.values()):
            await asyncio.sleep(1.5)  # a heartbeat (1 s) after the last finish: the KV usage it carries is final
            return True
        await asyncio.sleep(0.25)
    return False


def sample(target: Target, at_s: float, idle: bool) -> Checkpoint:
    point = Checkpoint(round(at_s, 1), idle)
    for role, pid in processes(target).items():
        try:
            process = psutil.Process(pid)
            point.processes[role] = {"rss_mib": round(process.memory_info().rss / 2**20, 1), "fds": process.num_fds(),
                                     "connections": len(process.net_connections(kind="inet"))}
        except psutil.NoSuchProcess:
            continue  # gone between the listing and the read: missing from this checkpoint, judged below
    point.kv_usage = {worker: m.get("kv_cache_usage", 0.0) for worker, m in metrics(target.address).items()}
    if target.redis_url:
        point.redis = redis_keys(target)
    return point


def redis_keys(target: Target) -> dict[str, int]:
    client = redis.Redis.from_url(target.redis_url, socket_connect_timeout=2)
    match = "*" if target.private_redis else f"*{target.queue_prefix}*"
    keys = list(client.scan_iter(match=match, count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.ttl(key)
    ttls = [t for t in pipe.execute() if t != -2]  # -2: expired since the scan
    return {"persistent": sum(t == -1 for t in ttls), "expiring": sum(t >= 0 for t in ttls),
            "longest_ttl_s": max([t for t in ttls if t >= 0], default=0)}


def verdict(points: list[Checkpoint]) -> list[dict]:
    """One row per measure: baseline, last, worst, tolerance, flat (see the module docstring)."""
    if len(points) < 3:
        return [{"measure": "checkpoints", "flat": False, "why": f"{len(points)} checkpoints; a verdict needs a "
                 "start, a baseline after warm-up and at least one more (a longer soak or a shorter interval)"}]
    base, later = points[1], points[2:]
    rows = [{"measure": "idle at every checkpoint", "flat": all(p.idle for p in points),
             "why": [p.at_s for p in points if not p.idle] or "all idle"}]
    for role, measured in base.processes.items():
        for name, value in measured.items():
            slack = max(RSS_SLACK_MIB, RSS_SLACK_SHARE * value) if name == "rss_mib" else HANDLE_SLACK
            seen = [p.processes.get(role, {}).get(name) for p in later]
            worst = max((v for v in seen if v is not None), default=value)
            rows.append({"measure": f"{role} {name}", "baseline": value, "last": seen[-1], "worst": worst,
                         "tolerance": round(slack, 1), "flat": None not in seen and worst <= value + slack})
    for worker, usage in base.kv_usage.items():
        seen = [p.kv_usage.get(worker) for p in later]
        rows.append({"measure": f"{worker} kv blocks in use (share)", "baseline": usage, "last": seen[-1],
                     "worst": max((v for v in seen if v is not None), default=usage), "tolerance": 0,
                     "flat": None not in seen and all(v <= usage for v in seen)})
    if base.redis is not None:
        persistent = [p.redis["persistent"] for p in later if p.redis]
        rows.append({"measure": "redis keys without expiry", "baseline": base.redis["persistent"],
                     "last": persistent[-1], "worst": max(persistent), "tolerance": 0,
                     "flat": max(persistent) <= base.redis["persistent"]})
        longest = max(p.redis["longest_ttl_s"] for p in points if p.redis)
        rows.append({"measure": "redis keys with a TTL (count; bounded by their TTL)",
                     "baseline": base.redis["expiring"], "last": later[-1].redis["expiring"] if later[-1].redis else None,
                     "longest_ttl_s": longest, "tolerance": f"TTL <= {ADMITTED_MEMORY_S + TTL_SLACK_S} s",
                     "flat": longest <= ADMITTED_MEMORY_S + TTL_SLACK_S})
    return rows
