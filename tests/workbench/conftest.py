"""Workbench fixtures: API tokens, and a real Daphne serving the app on a free local port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api_user(db):
    from django.contrib.auth import get_user_model

    from workbench.api.models import ApiToken

    user = get_user_model().objects.create_user("alice", password="pw-alice-123")
    _, token = ApiToken.issue(user, "test")
    return user, token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def daphne_server(tmp_path_factory):
    """A real Daphne on 127.0.0.1 with a fresh SQLite database; yields (base_url, api_token)."""
    db = tmp_path_factory.mktemp("daphne") / "db.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "workbench.settings", "WORKBENCH_DB_PATH": str(db)}
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, check=True, cwd=ROOT)
    token = subprocess.run([*manage, "createapitoken", "bob"], env=env, check=True, cwd=ROOT, capture_output=True,
                           text=True).stdout.strip().splitlines()[-1]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "workbench.asgi:application"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        server.kill()
        raise RuntimeError(f"daphne did not start: {server.stderr.read().decode()[-2000:]}")
    yield f"127.0.0.1:{port}", token
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture(scope="session", autouse=True)
def engine_thread_stops_at_the_end():
    """The in-process engine thread starts on first use; stop it before the interpreter exits."""
    yield
    from workbench.serving import bridge

    bridge.shutdown()
