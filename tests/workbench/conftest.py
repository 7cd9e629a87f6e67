"""Workbench fixtures: API tokens, an operator, a real Daphne with low request limits, and the
in-process engine thread's shutdown."""

from __future__ import annotations

import os

import pytest

# The limited Daphne's limits (test_limits.py fills them; test_big_frames.py and
# test_prefix_cache_isolation.py stay within them).
LIMITS = {"WORKBENCH_USER_CONCURRENT_REQUESTS": 2, "WORKBENCH_USER_REQUESTS_PER_MINUTE": 6, "WORKBENCH_MAX_IN_FLIGHT": 5}
# Each test's users are its own, so one test's counts never meet another's.
LIMITED_USERS = ["frames", "alice", "carol", "dave", "erin", "gina", "hank", "ivan",
                 "prefix-ws-bob", "prefix-ws-carol", "prefix-http-bob", "prefix-http-carol"]


@pytest.fixture(scope="session")
def limited_daphne(tmp_path_factory):
    """A real in-process Daphne (as deployments start it) with LIMITS and the default frame limits;
    yields (address, {username: API token}) for LIMITED_USERS."""
    from tests.cluster import issue_tokens, start_daphne

    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_") or k == "WORKBENCH_SECRET_KEY"}
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


@pytest.fixture(scope="session", autouse=True)
def engine_thread_stops_at_the_end():
    """The in-process engine thread starts on first use; stop it before the interpreter exits."""
    yield
    from workbench.serving import bridge

    bridge.shutdown()
