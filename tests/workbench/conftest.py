"""Workbench fixtures: API tokens, an operator, and the in-process engine thread's shutdown."""

from __future__ import annotations

import pytest


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
