"""Workbench fixtures: API tokens, an operator, a real Daphne with low request limits, and the
in-process engine thread's shutdown."""

from __future__ import annotations

import os

import pytest

# The limited Daphne's limits (test_limits.py fills them, test_strangers.py and test_http_door.py the tokenize and input ones;
# test_big_frames.py and test_prefix_cache_isolation.py stay within them).
# The frame limit is low so that a flood outruns it however slowly a loaded machine answers each frame
# (at 50 a second a server spending 20 ms a frame would never fall behind its budget).
# The input share is so small that one large request spends it (10 ms of reading in 10 s).
LIMITS = {"WORKBENCH_USER_CONCURRENT_REQUESTS": 2, "WORKBENCH_USER_REQUESTS_PER_MINUTE": 6, "WORKBENCH_MAX_IN_FLIGHT": 5,
          "WORKBENCH_USER_TOKENIZE_PER_MINUTE": 6, "WORKBENCH_SOCKET_FRAMES_PER_S": 8,
          "WORKBENCH_USER_INPUT_SHARE": 0.001}
# Each test's users are its own, so one test's counts never meet another's.
LIMITED_USERS = ["frames", "frames-1009", "alice", "carol", "dave", "erin", "gina", "hank", "ivan",
                 "prefix-ws-bob", "prefix-ws-carol", "prefix-http-bob", "prefix-http-carol", "tokenizer", "jane", "flooder",
                 "big-reader", "bystander", "door", "door-control", "http-door", "http-door-bystander",
                 "http-door-expects"]


@pytest.fixture(scope="session")
def limited_daphne(tmp_path_factory):
    """A real in-process Daphne (as deployments start it) with LIMITS and the default socket limits;
    yields (address, {username: API token}) for LIMITED_USERS."""
    from tests.cluster import issue_tokens, start_daphne

    kept = ("WORKBENCH_SECRET_KEY", "WORKBENCH_SIGNUP", "WORKBENCH_SIGNUPS_PER_ADDRESS")  # tests/settings.py's
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_") or k in kept}
    env = {**env, "WORKBENCH_TRANSPORT": "inprocess", **{k: str(v) for k, v in LIMITS.items()}}
    db_path = tmp_path_factory.mktemp("limited") / "db.sqlite3"
    process, address, _ = start_daphne(env, db_path)
    try:
        yield address, issue_tokens(env, db_path, LIMITED_USERS)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def api_user(db):
    from django.contrib.auth import get_user_model

    from workbench.api.models import ApiToken

    user = get_user_model().objects.create_user("alice", password="pw-alice-123")
    _, token = ApiToken.issue(user, "test")
    return user, token


@pytest.fixture
def operator(django_user_model):
    """Staff with the permission to change runtime flags."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("olga", password="pw-olga-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="flip_flags"))
    return user


@pytest.fixture
def quick_dashboard(monkeypatch):
    """The dashboard pushes every 20 ms, not 250: it shows a request that runs to the demo model's length
    (512 positions: 0.7 s on the fastest machine seen) early in its reply, while an operator can still act on it."""
    from workbench.ops import consumers

    monkeypatch.setattr(consumers, "PUSH_EVERY_S", 0.02)


@pytest.fixture(scope="session", autouse=True)
def engine_thread_stops_at_the_end():
    """The in-process engine thread starts on first use; stop it before the interpreter exits."""
    yield
    from workbench.serving import bridge

    bridge.shutdown()


@pytest.fixture(scope="session", autouse=True)
def flush_waits_for_other_writers():
    """A transactional test's flush waits for a write on another thread of this process (flush_waits.py)."""
    from django.test import TransactionTestCase

    from tests.workbench.flush_waits import waiting_for_other_writers

    flush = TransactionTestCase._fixture_teardown
    TransactionTestCase._fixture_teardown = waiting_for_other_writers(flush)
    yield
    TransactionTestCase._fixture_teardown = flush


def pytest_collection_modifyitems(config, items):
    """On PostgreSQL (tests/settings_postgres.py), every test skips, saying why, when no server answers:
    the PostgreSQL run needs one (.ci/run starts it where none answers), and a run that found none must
    not pass as if it had tested anything. Asked with psycopg itself: pytest-django lets no connection
    through before a test."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if not items or "postgresql" not in database["ENGINE"]:
        return
    import psycopg

    where = f"{database.get('HOST') or 'the local socket'}:{database.get('PORT') or 5432}"
    try:
        psycopg.connect(host=database.get("HOST") or None, port=database.get("PORT") or None,
                        user=database.get("USER") or None, password=database.get("PASSWORD") or None,
                        dbname=database.get("NAME") or None, connect_timeout=3).close()
    except psycopg.Error as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        skip = pytest.mark.skip(reason=f"no PostgreSQL answers at {where} ({first_line}); set "
                                       "WORKBENCH_TEST_POSTGRES_URL or start one (.ci/run does)")
        for item in items:
            item.add_marker(skip)
