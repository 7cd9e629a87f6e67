"""`make stack`'s script end to end: with no Redis at REDIS_URL it starts one, serves a request through
two real workers, and Ctrl-C stops every process it started, Redis included."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import redis
import websockets

from engine.kernels.cpu.build import build_directory
from tests.cluster import ROOT, free_port, wait_for_port
from tests.waiting import wait_until


def test_stack_starts_serves_and_stops_everything(tmp_path):
    redis_url, port = f"redis://127.0.0.1:{free_port()}/0", free_port()
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "REDIS_URL": redis_url, "WORKBENCH_DB_PATH": str(tmp_path / "db"),
           "WORKBENCH_ADMIN_PASSWORD": "pw-admin-123", "WORKBENCH_DRAIN_S": "2", "HOME": str(tmp_path),
           # The kernels this checkout built: under the fresh HOME each worker would build them again
           # (a minute or more on two cores) while the request waits for its first frame.
           "TORCH_EXTENSIONS_DIR": str(build_directory().parent)}
    log = open(tmp_path / "stack.log", "w")
    stack = subprocess.Popen([sys.executable, "-m", "scripts.stack", "--workers", "2", "--port", str(port)],
                             env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, stack, "the stack's daphne", timeout=60)
        assert redis.Redis.from_url(redis_url).ping(), "it started its own Redis"
        token = subprocess.run([sys.executable, "manage.py", "createapitoken", "admin"], env=env, cwd=ROOT,
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]

        async def ask() -> dict:
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws/v1/generate",
                                          additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                await ws.send(json.dumps({"type": "generate", "request_id": "s", "prompt": "The list type",
                                          "params": {"max_tokens": 8, "temperature": 0}}))
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if frame["type"] in ("done", "error"):
                        return frame

        deadline, frame = time.monotonic() + 60, None
        while time.monotonic() < deadline:  # the workers load their engines after daphne listens
            frame = asyncio.run(ask())
            if frame["type"] == "done":
                break
            assert frame["code"] == "unavailable", frame
            time.sleep(0.5)
        assert frame["type"] == "done" and frame["usage"]["completion_tokens"] == 8
        # One worker up is enough to answer; the other may still be loading its engine.
        client = redis.Redis.from_url(redis_url)
        wait_until(lambda: len(client.keys("workbench:worker:*")) == 2, 60, "both workers' heartbeats")
        # Each worker gets its share of the cores: two torch thread teams of every core would fight.
        pids = subprocess.run(["pgrep", "-P", str(stack.pid), "-f", "celery"], capture_output=True,
                              text=True).stdout.split()
        assert len(pids) == 2, pids
        for pid in pids:
            environ = dict(item.split("=", 1) for item in open(f"/proc/{pid}/environ").read().split("\0") if "=" in item)
            assert environ.get("OMP_NUM_THREADS") == str(max(1, len(os.sched_getaffinity(0)) // 2)), pid
    finally:
        stack.send_signal(signal.SIGINT)
        stack.wait(timeout=60)
    output = (tmp_path / "stack.log").read_text()
    assert "stack: stopped" in output, output[-3000:]
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()
        raise AssertionError("the stack's Redis is still running")
    except redis.ConnectionError:
        pass
    leftover = subprocess.run(["pgrep", "-f", f"daphne.*-p {port}"], capture_output=True, text=True).stdout
    assert not leftover.strip(), "daphne outlived the stack"
