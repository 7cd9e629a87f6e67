"""Workbench fixtures: API tokens, and the in-process engine thread's shutdown."""

from __future__ import annotations

import pytest


@pytest.fixture
def api_user(db):
    from django.contrib.auth import get_user_model

    from workbench.api.models import ApiToken

    user = get_user_model().objects.create_user("alice", password="pw-alice-123")
    _, token = ApiToken.issue(user, "test")
    return user, token


@pytest.fixture(scope="session", autouse=True)
def engine_thread_stops_at_the_end():
    """The in-process engine thread starts on first use; stop it before the interpreter exits."""
    yield
    from workbench.serving import bridge

    bridge.shutdown()
