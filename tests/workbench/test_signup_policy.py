"""The sign-up policy (WORKBENCH_SIGNUP: open, invite, closed), invite codes and the sign-up throttle,
in-process with Django's test client (the shared servers run sign-up open, unthrottled: tests/settings.py).
The throttle on signing in is tried against a real Daphne (test_strangers.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client, override_settings
from django.utils import timezone

from workbench.accounts.models import Invite

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-pass-9!"


@pytest.fixture(autouse=True)
def fresh_counts():
    cache.clear()  # the throttles' counts are the cache's (this process's memory here)
    yield
    cache.clear()


def sign_up(username: str, invite: str | None = None, password: str = PASSWORD, client: Client | None = None):
    fields = {"username": username, "password1": password, "password2": password}
    return (client or Client()).post("/signup", {**fields, **({} if invite is None else {"invite": invite})})


@override_settings(WORKBENCH_SIGNUP="invite")
def test_invite_sign_up_needs_a_valid_code_and_tells_nothing_without_one(django_user_model):
    django_user_model.objects.create_user("taken", password=PASSWORD)
    assert b'name="invite"' in Client().get("/signup").content
    without = sign_up("newcomer")
    assert without.status_code == 400 and not django_user_model.objects.filter(username="newcomer").exists()
    # A taken name and a free one, each with a wrong code (and a weak password): the same answer.
    taken, free = sign_up("taken", "wrong-code", "a"), sign_up("free-name", "wrong-code", "a")
    assert taken.status_code == free.status_code == 400
    assert taken.context["form"].errors == free.context["form"].errors
    assert list(taken.context["form"].errors) == ["invite"], taken.context["form"].errors

    invite = Invite.objects.create(note="for a colleague", uses_left=1)
    weak = sign_up("colleague", invite.code, "a")
    assert weak.status_code == 400 and "password2" in weak.context["form"].errors, "the validators run with a code"
    assert Invite.objects.get(pk=invite.pk).uses_left == 1, "a refused sign-up uses nothing"
    made = sign_up("colleague", invite.code)
    assert made.status_code == 302 and django_user_model.objects.filter(username="colleague").exists()
    assert Invite.objects.get(pk=invite.pk).uses_left == 0
    again = sign_up("second-colleague", invite.code)
    assert again.status_code == 400 and not django_user_model.objects.filter(username="second-colleague").exists()

    expired = Invite.objects.create(expires_at=timezone.now() - timedelta(minutes=1))
    assert sign_up("late", expired.code).status_code == 400


@override_settings(WORKBENCH_SIGNUP="closed")
def test_closed_sign_up_makes_no_account(django_user_model):
    invite = Invite.objects.create()
    page = Client().get("/signup")
    assert page.status_code == 200 and b"ask" in page.content.lower() and b"<form method=\"post\">" not in page.content
    assert sign_up("anyone", invite.code).status_code == 403
    assert not django_user_model.objects.filter(username="anyone").exists()


@override_settings(WORKBENCH_SIGNUP="open", WORKBENCH_SIGNUPS_PER_ADDRESS=3)
def test_sign_up_attempts_are_throttled_per_address(django_user_model):
    assert [sign_up(f"user-{n}").status_code for n in range(3)] == [302, 302, 302]
    refused = sign_up("user-3")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert not django_user_model.objects.filter(username="user-3").exists()
    elsewhere = Client(REMOTE_ADDR="192.0.2.8")
    assert sign_up("user-4", client=elsewhere).status_code == 302, "another address has its own count"


@override_settings(WORKBENCH_SIGNUP="open")
def test_open_sign_up_refuses_weak_passwords_by_name(django_user_model):
    for weak in ("a", "password", "12345678901", "weakling-1"):  # short, common, digits, the username
        answer = sign_up("weakling-1", password=weak)
        assert answer.status_code == 400 and "password2" in answer.context["form"].errors, weak
    assert not django_user_model.objects.filter(username="weakling-1").exists()
    assert sign_up("weakling-1").status_code == 302
