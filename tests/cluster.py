"""Real processes for the distributed transport's tests: Celery GPU workers, Daphne, a private Redis.

Each test cluster gets its own queue prefix, so several share the machine's Redis without seeing each
other's workers; a test that stops Redis starts a Redis of its own. Worker logs are kept to count
admissions (a request admitted twice anywhere would be a request run twice).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from functools import lru_cache
from pathlib import Path

import redis

from tests.server_logs import register as register_log
from tests.waiting import wait_until
from workbench.serving.celery.presence import WORKER_KEY

ROOT = Path(__file__).resolve().parents[1]


def settings_module() -> str:
    """The Django settings a started process runs: the test run's own (tests/settings.py) under pytest,
    the deployment's for a bench script that starts a server."""
    return os.environ.get("DJANGO_SETTINGS_MODULE", "workbench.settings")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


@lru_cache(maxsize=1)
def migrated_database() -> Path:
    """A SQLite database migrated once per test process (by `manage.py migrate`, as a deployment's is):
    each server's database starts as a copy of it, where a migrate per start cost a process of its own."""
    folder = Path(tempfile.mkdtemp(prefix="workbench-migrated-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "db.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module(), "WORKBENCH_DB_PATH": str(path)}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], env=env, check=True, cwd=ROOT)
    return path


def start_daphne(env: dict, db_path: Path) -> tuple[subprocess.Popen, str, str]:
    """A real Daphne (started as every deployment starts it, workbench/serve.py) on 127.0.0.1 over the
    SQLite database at `db_path` (a migrated one where it is new; kept where it exists, for a restart), with
    an API token for user "bob", logging beside it; returns (process, address, token)."""
    env = {**env, "DJANGO_SETTINGS_MODULE": settings_module(), "WORKBENCH_DB_PATH": str(db_path)}
    manage = [sys.executable, str(ROOT / "manage.py")]
    if not db_path.exists():
        shutil.copyfile(migrated_database(), db_path)
    port, log = free_port(), db_path.with_suffix(".daphne.log")
    register_log(log)
    server = subprocess.Popen([sys.executable, "-m", "workbench.serve", "-b", "127.0.0.1", "-p", str(port)],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        # While Daphne starts (it reads no database until a request comes): seconds on a loaded machine.
        token = subprocess.run([*manage, "createapitoken", "bob"], env=env, check=True, cwd=ROOT,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1]
        wait_for_port(port, server, "daphne")
    except (RuntimeError, subprocess.CalledProcessError):
        server.kill()
        raise RuntimeError(f"daphne did not start: {log.read_text()[-2000:]}") from None
    return server, f"127.0.0.1:{port}", token


def django_script(env: dict, db_path: Path, script: str, *args: str) -> str:
    """`script` run with Django set up over the database Daphne serves at `db_path`, in a process of its
    own (`sys` imported, `args` in sys.argv[1:]); what it printed. One process for a batch of users,
    tokens or sessions: a management command each would cost seconds apiece on a loaded machine."""
    env = {**env, "DJANGO_SETTINGS_MODULE": settings_module(), "WORKBENCH_DB_PATH": str(db_path)}
    return subprocess.run([sys.executable, "-c", f"import sys, django; django.setup(); exec({script!r})", *args],
                          env=env, check=True, cwd=ROOT, capture_output=True, text=True).stdout


def issue_tokens(env: dict, db_path: Path, usernames: list[str]) -> dict[str, str]:
    """An API token for each of `usernames` (created as needed) in the database at `db_path`."""
    script = ("from django.contrib.auth import get_user_model; from workbench.api.models import ApiToken\n"
              "for name in sys.argv[1:]:\n"
              "    print(name, ApiToken.issue(get_user_model().objects.get_or_create(username=name)[0], 'test')[1])")
    out = django_script(env, db_path, script, *usernames)
    return dict(line.split() for line in out.strip().splitlines())


def operator_session(env: dict, db_path: Path, conversations: int = 0, username: str = "olga") -> tuple[str, list[int]]:
    """A staff user `username` with the flag permission (made if absent), signed in: (the session cookie's
    value, the ids of `conversations` new conversations it owns), in the database Daphne serves at `db_path`."""
    script = (
        "from django.contrib.auth import get_user_model; from django.contrib.auth.models import Permission\n"
        "from django.test import Client; from workbench.chat.models import Conversation\n"
        "user, _ = get_user_model().objects.get_or_create(username=sys.argv[1], defaults={'is_staff': True})\n"
        "user.user_permissions.add(Permission.objects.get(codename='flip_flags'))\n"
        "client = Client(); client.force_login(user)\n"
        "ids = [Conversation.objects.create(owner=user).pk for _ in range(int(sys.argv[2]))]\n"
        "print(client.cookies['sessionid'].value, *ids)")
    out = django_script(env, db_path, script, username, str(conversations)).split()
    return out[0], [int(pk) for pk in out[1:]]


class RedisServer:
    """redis-server on a free port, keeping nothing on disk; stop() and start() keep the port."""

    def __init__(self, *options: str) -> None:
        """`options`: more redis-server command-line options."""
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.options = options
        self.process: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no", *self.options],
                                        stdout=subprocess.DEVNULL)
        wait_for_port(self.port, self.process, "redis-server")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


class Cluster:
    """Workers (and optionally a Daphne) for one queue prefix on one Redis."""

    def __init__(self, redis_url: str, log_dir: Path, app: str = "workbench", **env) -> None:
        """`app`: the Celery app the workers run (tests/fault_worker.py's for the fault tests)."""
        self.app = app
        self.prefix = f"wbtest-{uuid.uuid4().hex[:8]}"
        self.log_dir = log_dir
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module(), "REDIS_URL": redis_url,
                    "WORKBENCH_TRANSPORT": "celery", "WORKBENCH_QUEUE_PREFIX": self.prefix,
                    "WORKBENCH_DRAIN_S": "2", **{k: str(v) for k, v in env.items()}}
        self.workers: list[subprocess.Popen] = []
        self.daphne: subprocess.Popen | None = None

    def start_workers(self, count: int, timeout: float = 90, each: list[dict] | None = None,
                      **env) -> list[subprocess.Popen]:
        """`env`: settings of these workers alone; `each`: the i-th worker's own, on top of those (a worker
        of another model: {"WORKBENCH_MODEL": ...}). They start side by side."""
        started = []
        for n in range(count):
            env_n = {**env, **(each[n] if each else {})}
            log = open(self.log_dir / f"worker-{len(self.workers)}.log", "w")
            register_log(Path(log.name))
            process = subprocess.Popen([sys.executable, "-m", "celery", "-A", self.app, "worker", "--pool", "solo",
                                        "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
                                       env={**self.env, **{k: str(v) for k, v in env_n.items()}}, cwd=ROOT, stdout=log,
                                       stderr=subprocess.STDOUT)
            process.log_path = log.name
            self.workers.append(process)
            started.append(process)
        deadline = time.monotonic() + timeout
        for process in started:
            while "ready: model" not in Path(process.log_path).read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not start:\n{Path(process.log_path).read_text()[-3000:]}")
                time.sleep(0.2)
        client = redis.Redis.from_url(self.env["REDIS_URL"], socket_connect_timeout=3)
        keys = [WORKER_KEY.format(prefix=self.prefix, worker_id=self.worker_id(p)) for p in started]
        wait_until(lambda: client.exists(*keys) == len(keys), timeout=30, what="the workers' first heartbeats in Redis")
        client.close()
        return started

    def worker_id(self, process: subprocess.Popen) -> str:
        return re.search(r"worker (\S+) ready", Path(process.log_path).read_text()).group(1)

    def admissions(self) -> dict[str, list[str]]:
        """request id -> the workers that admitted it (more than one would mean it ran twice)."""
        admitted: dict[str, list[str]] = {}
        for process in self.workers:
            for request_id in re.findall(r"admitted (\S+)", Path(process.log_path).read_text()):
                admitted.setdefault(request_id, []).append(self.worker_id(process))
        return admitted

    def kill(self, process: subprocess.Popen) -> None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def start_daphne(self, db_path: Path) -> tuple[str, str]:
        """A Daphne over this cluster with a fresh database; returns (address, an API token)."""
        self.daphne, address, token = start_daphne(self.env, db_path)
        return address, token

    def stop(self) -> None:
        self.stop_processes()
        try:  # what this cluster left in Redis (flags in force have no expiry)
            client = redis.Redis.from_url(self.env["REDIS_URL"], socket_connect_timeout=1)
            for pattern in (f"{self.prefix}*", f"_kombu.binding*.{self.prefix}*"):  # kombu's: a killed worker's
                for key in client.scan_iter(match=pattern):
                    client.delete(key)
        except redis.RedisError:
            pass  # a test that stopped Redis: nothing left

    def stop_processes(self) -> None:
        for process in [*self.workers, self.daphne]:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in [*self.workers, self.daphne]:
            if process is not None:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
