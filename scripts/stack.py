"""`make stack`: the multi-process deployment on one machine, for trying it out and for its tests.

    .venv/bin/python -m scripts.stack [--workers 2] [--host 127.0.0.1] [--port 8000]

Uses the Redis at REDIS_URL, or starts one there when none answers (and stops it again at the end);
DATABASE_URL when set (PostgreSQL, say), SQLite otherwise; WORKBENCH_SECRET_KEY when set, else the
checkout's own key (workbench/secret_key.py), as `make run` does. Applies the migrations, makes sure the admin
user exists, then runs N Celery GPU workers and one Daphne with WORKBENCH_TRANSPORT=celery. Ctrl-C
(or SIGTERM) stops them all; the workers finish what they hold first (up to WORKBENCH_DRAIN_S).
A worker that dies is reported and not restarted; the others go on serving.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

from workbench.secret_key import local_key

ROOT = Path(__file__).resolve().parents[1]


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def start_redis(url: str) -> subprocess.Popen:
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or shutil.which("redis-server") is None:
        sys.exit(f"no Redis answers at {url}, and one cannot be started here (install redis-server, or set REDIS_URL)")
    process = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(parsed.port or 6379),
                                "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while not redis_answers(url):
        if time.monotonic() > deadline or process.poll() is not None:
            sys.exit(f"redis-server did not start at {url}")
        time.sleep(0.1)
    print(f"stack: started redis-server at {url}", flush=True)
    return process


def threads_each(workers: int, env: dict[str, str]) -> str:
    """Each worker's OMP_NUM_THREADS (torch's thread count follows it): `env`'s own if it sets one, else
    its share of the cores this process may use. Left to torch, every worker takes every core: two
    workers on two cores then ask four threads of them, and the kernels' parallel regions wait at each
    barrier for a thread that is not running (on a 2-core Xeon the load bench's two SmolLM2 workers did
    13.7 tok/s so, and 173 with a core each)."""
    return env.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKBENCH_WORKERS", 2)))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")

    env = {**os.environ, "WORKBENCH_TRANSPORT": "celery", "DJANGO_SETTINGS_MODULE": "workbench.settings"}
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    # Daphne refuses the development key with DEBUG off (the default); unset or empty counts as unset.
    env["WORKBENCH_SECRET_KEY"] = env.get("WORKBENCH_SECRET_KEY") or local_key()
    own_redis = None if redis_answers(env["REDIS_URL"]) else start_redis(env["REDIS_URL"])
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "--noinput", "-v0"], env=env, cwd=ROOT, check=True)
    subprocess.run([python, "manage.py", "ensureadmin"], env=env, cwd=ROOT, check=True)

    worker_env = {**env, "OMP_NUM_THREADS": threads_each(args.workers, env)}
    workers = [subprocess.Popen([python, "-m", "celery", "-A", "workbench", "worker", "--pool", "solo",
                                 "--without-mingle", "--without-gossip", "--loglevel", "INFO",
                                 "--hostname", f"worker{i}@%h"], env=worker_env, cwd=ROOT, start_new_session=True)
               for i in range(args.workers)]
    # Own sessions: a terminal's Ctrl-C reaches only this script, which stops the children in order.
    web = subprocess.Popen([python, "-m", "workbench.serve", "-b", args.host, "-p", str(args.port)],
                           env=env, cwd=ROOT, start_new_session=True)
    print(f"stack: workbench on http://{args.host}:{args.port} with {args.workers} worker(s); Ctrl-C stops it",
          flush=True)

    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    reported: set[int] = set()
    while not stopping and web.poll() is None:
        for i, worker in enumerate(workers):
            if worker.poll() is not None and i not in reported:
                reported.add(i)
                print(f"stack: worker {i} exited with {worker.returncode}", flush=True)
        time.sleep(0.5)

    for process in [web, *workers]:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in [web, *workers]:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    if own_redis is not None:
        own_redis.terminate()
        own_redis.wait(timeout=10)
    print("stack: stopped", flush=True)


if __name__ == "__main__":
    main()
