"""The server under bench/load.py's load, and what the bench reads from it from outside.

`start` brings up a real stack on loopback with tests/cluster.py (the launcher the tests use, so there is
no third one): the in-process transport is one Daphne (`python -m workbench.serve`) with the engine on a
thread; the Celery transport is a private redis-server, N Celery GPU workers and one Daphne, as
`make stack` runs them. Either way: a fresh SQLite database, the per-user limits off, the device loop
and graphs as asked (their ARC_* variables, as a deployment sets them), an API token per load user and
a signed-in staff session for the dashboard socket.

What it reads: each engine's runtime flags in force and its device-loop bursts and graph replays (the
dashboard socket's state frame, what an operator sees), each worker's running/waiting requests and KV
cache usage (/metrics), and which processes serve the stack (the web process by its listening port,
Celery workers by the pid in their Redis heartbeats).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis
import websockets
from prometheus_client.parser import text_string_to_metric_families

from workbench.serving.celery.presence import WORKER_KEY, Heartbeat

DEVICE_LOOP, GRAPHS = "ARC_GRAPH_DEVICE_LOOP", "ARC_GRAPHS"
OPERATOR = "load-operator"


@dataclass
class Target:
    """A running stack the load goes to."""
    transport: str  # "inprocess" or "celery"
    address: str  # 127.0.0.1:PORT
    tokens: dict[str, str]  # username -> API token
    session: str | None  # a staff session cookie for /ws/ops/dashboard; None: the flags are not read
    redis_url: str | None = None  # the Celery transport's Redis
    queue_prefix: str | None = None  # the Celery transport's WORKBENCH_QUEUE_PREFIX
    private_redis: bool = False  # every key in that Redis is the stack's (else only those naming the prefix)
    stop: Callable[[], None] = lambda: None
    # What a stack started here is made of, for a bench that breaks parts of it (bench/chaos_soak.py):
    # the web process's database, and on the Celery transport the workers (tests/cluster.py's Cluster)
    # and the private redis-server (RedisServer).
    db_path: Path | None = None
    cluster: Any = None
    redis_server: Any = None
    model: str = "demo"  # the served model's name (WORKBENCH_MODEL), which the OpenAI clients ask for


def start(transport: str, workdir: Path, users: list[str], device_loop: bool, graphs: bool,
          workers: int = 2, model: str = "demo") -> Target:
    """A fresh stack of `transport` (see the module docstring) serving `model`, in the dtype and weights
    WORKBENCH_DTYPE and WORKBENCH_WEIGHTS of this environment give; call its stop() at the end."""
    from scripts.stack import threads_each
    from tests.cluster import Cluster, RedisServer, issue_tokens, operator_session, start_daphne

    settings = {DEVICE_LOOP: "1" if device_loop else "0", GRAPHS: "1" if graphs else "0",
                "WORKBENCH_MODEL": model, "WORKBENCH_USER_CONCURRENT_REQUESTS": "0", "WORKBENCH_USER_REQUESTS_PER_MINUTE": "0",
                "WORKBENCH_SECRET_KEY": os.environ.get("WORKBENCH_SECRET_KEY") or "bench-load-only-" + "x" * 40}
    db_path = workdir / "db.sqlite3"
    if transport == "inprocess":
        env = {**os.environ, "WORKBENCH_TRANSPORT": "inprocess", **settings}
        server, address, _ = start_daphne(env, db_path)

        def stop() -> None:
            server.terminate()
            server.wait(timeout=15)
        target = Target(transport, address, {}, None, stop=stop, db_path=db_path, model=model)
    else:
        redis_server = RedisServer().start()
        # Each worker its share of the cores, as `make stack` gives it (scripts/stack.py says why).
        cluster = Cluster(redis_server.url, workdir, OMP_NUM_THREADS=threads_each(workers, dict(os.environ)),
                          **settings)

        def stop() -> None:
            cluster.stop()
            redis_server.stop()
        try:
            cluster.start_workers(workers)
            address, _ = cluster.start_daphne(db_path)
        except BaseException:
            stop()
            raise
        env = cluster.env
        target = Target(transport, address, {}, None, redis_server.url, cluster.prefix, True, stop, db_path, cluster,
                        redis_server, model)
    try:
        target.tokens = issue_tokens(env, db_path, users)
        target.session = operator_session(env, db_path, username=OPERATOR)[0]
        wait_healthy(address)
    except BaseException:
        target.stop()
        raise
    return target


def wait_healthy(address: str, timeout: float = 180) -> None:
    """Until /health says ok: its first probe starts the transport (the engine loads, or the web process
    hears the workers), which would otherwise happen inside the first socket's handshake, and Daphne
    drops a handshake the application has not accepted within 5 s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}/health", timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.HTTPError, urllib.error.URLError, TimeoutError):
            pass  # 503 while starting
        if time.monotonic() > deadline:
            raise RuntimeError(f"{address}/health not ok within {timeout} s")
        time.sleep(0.5)


def dashboard(address: str, session: str):
    return websockets.connect(f"ws://{address}/ws/ops/dashboard", additional_headers={"Cookie": f"sessionid={session}"})


async def engines(target: Target, timeout: float = 30) -> dict[str, dict]:
    """worker -> {flags in force, device_loop_bursts, graph_replays, capture mode} as the dashboard shows
    it (the first state frame that names a worker; a Celery web process learns them from heartbeats)."""
    async with dashboard(target.address, target.session) as ws:
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            if frame.get("type") == "state" and frame["workers"]:
                break
    return {worker: {"flags": {name: view["flags"].get(name) for name in (DEVICE_LOOP, GRAPHS)},
                     "device_loop_bursts": view["state"]["device_loop"]["bursts"],
                     "device_loop_engaged": view["state"]["device_loop"]["engaged"],
                     "graph_replays": view["state"]["capture"]["replays"],
                     "capture_mode": view["state"]["capture"]["mode"]}
            for worker, view in frame["workers"].items()}


async def engines_after(target: Target, before: dict[str, dict], timeout: float = 10) -> dict[str, dict]:
    """engines() once the view shows a run since `before`: bursts or graph replays counted. A Celery web
    process learns the counters from heartbeats, which its link reads every WORKBENCH_HEARTBEAT_S, so
    right after a short run its view can still be one from before the run. After `timeout`, the last view."""
    deadline = time.monotonic() + timeout
    while True:
        after = await engines(target)
        ran = any(view[counter] != before.get(worker, {}).get(counter, 0)
                  for worker, view in after.items() for counter in ("device_loop_bursts", "graph_replays"))
        if ran or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.25)


async def set_flags(target: Target, values: dict[str, bool], timeout: float = 30) -> dict[str, dict]:
    """Change runtime flags on every worker over the dashboard socket, as an operator does, and wait
    until the dashboard's state shows them in force on every worker (a Celery worker's answer comes
    before its next heartbeat); returns flag -> the flag_result frame."""
    results = {}
    async with dashboard(target.address, target.session) as ws:
        for name, value in values.items():
            await ws.send(json.dumps({"type": "set_flag", "id": name, "name": name, "value": value}))
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
                if frame.get("type") in ("flag_result", "error") and frame.get("id") == name:
                    results[name] = frame
                    break
    deadline = time.monotonic() + timeout
    while not all(view["flags"].get(name) == value for view in (await engines(target)).values()
                  for name, value in values.items()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not show {values} in force within {timeout} s")
        await asyncio.sleep(0.5)
    return results


def runtime_check(before: dict[str, dict], after: dict[str, dict], device_loop: bool, graphs: bool) -> tuple[list[str], bool]:
    """Lines saying, per worker, which flags were in force before and after the run and how many bursts
    and graph replays it ran meanwhile; ok when every asked-for flag was in force throughout on every
    worker and the run did burst / replay (a flag in force that never acted would prove nothing)."""
    lines, ok = [], True
    wanted = {DEVICE_LOOP: device_loop, GRAPHS: graphs}
    for worker in sorted(after):
        was, now = before.get(worker, {}), after[worker]
        bursts = now["device_loop_bursts"] - was.get("device_loop_bursts", 0)
        replays = now["graph_replays"] - was.get("graph_replays", 0)
        flags = {name: (was.get("flags", {}).get(name), now["flags"][name]) for name in wanted}
        lines.append(f"worker {worker}: {DEVICE_LOOP} {flags[DEVICE_LOOP]} (engaged {now['device_loop_engaged']}), "
                     f"{GRAPHS} {flags[GRAPHS]} ({now['capture_mode']}); this run: {bursts} bursts, {replays} graph replays")
        ok &= all(flags[name] == (value, value) for name, value in wanted.items())
    total_bursts = sum(a["device_loop_bursts"] - before.get(w, {}).get("device_loop_bursts", 0) for w, a in after.items())
    total_replays = sum(a["graph_replays"] - before.get(w, {}).get("graph_replays", 0) for w, a in after.items())
    ok &= (total_bursts > 0 or not device_loop) and (total_replays > 0 or not graphs) and set(before) <= set(after)
    return lines, bool(ok)


def metrics(address: str) -> dict[str, dict[str, float]]:
    """worker -> running, waiting, kv_cache_usage from /metrics."""
    names = {"workbench_requests_running": "running", "workbench_requests_waiting": "waiting",
             "workbench_kv_cache_usage_ratio": "kv_cache_usage"}
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                out.setdefault(sample.labels["worker"], {})[names[sample.name]] = sample.value
    return out


def processes(target: Target) -> dict[str, int]:
    """role -> pid of each process serving the stack: "web" (listening on the address's port) and, on
    the Celery transport, "worker <id>" from each live heartbeat."""
    port = int(target.address.rsplit(":", 1)[1])
    web = next((c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid), None)
    if web is None:
        raise RuntimeError(f"no process of this user listens on {target.address}: the soak samples local processes only")
    found = {"web": web}
    if target.redis_url and target.queue_prefix:
        client = redis.Redis.from_url(target.redis_url, socket_connect_timeout=2)
        keys = list(client.scan_iter(match=WORKER_KEY.format(prefix=target.queue_prefix, worker_id="*")))
        for raw in client.mget(keys) if keys else []:
            if raw:
                beat = Heartbeat.from_json(raw)
                found[f"worker {beat.worker_id}"] = beat.pid
    return found
