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


def answer_of(response) -> tuple[int, str, bytes, bool]:
    """What a sign-up's answer shows its sender: status, where it leads, body, and whether it signed in."""
    return (response.status_code, response.get("Location", ""), response.content,
            "_auth_user_id" in response.wsgi_request.session)


@override_settings(WORKBENCH_SIGNUP="open")
def test_open_sign_up_answers_a_taken_name_as_it_answers_a_free_one(django_user_model):
    """Anyone may send the open sign-up form: its answer must not say which names exist. A taken name
    (in any case) gets what a free one gets, a redirect to the login page, and no account is made or
    changed for it; the maker of a free one logs in there. The form's other errors show as ever,
    without the name's."""
    owner = django_user_model.objects.create_user("taken", password=PASSWORD)
    prober = "another-long-pass-7!"
    taken, upper = sign_up("taken", password=prober), sign_up("TAKEN", password=prober)
    free = sign_up("free-name", password=prober)
    assert answer_of(free)[0] == 302 and not answer_of(free)[3], "liveness: a free name is made, not signed in"
    assert django_user_model.objects.filter(username="free-name").exists()
    for answer, name in ((taken, "taken"), (upper, "TAKEN")):
        status, location, body, signed_in = answer_of(answer)
        assert (status, body, signed_in) == (302, answer_of(free)[2], False), answer_of(answer)
        assert location == free["Location"].replace("free-name", name), (location, free["Location"])
    assert django_user_model.objects.filter(username__iexact="taken").count() == 1
    owner.refresh_from_db()
    assert owner.check_password(PASSWORD) and not owner.check_password(prober), "the owner's account is untouched"
    page = Client().get(free["Location"]).content.decode()
    assert 'id="signed-up"' in page and 'value="free-name"' in page, "the login page says what to do next"
    assert Client().login(username="free-name", password=prober), "the new account's maker logs in"
    # Refused for another reason: the same errors for a taken and a free name, none of them the name's.
    weak_taken, weak_free = sign_up("taken", password="a"), sign_up("other-free", password="a")
    assert weak_taken.status_code == weak_free.status_code == 400
    assert list(weak_taken.context["form"].errors) == list(weak_free.context["form"].errors) == ["password2"]


@override_settings(WORKBENCH_SIGNUP="open")
def test_open_sign_up_hashes_the_password_once_for_a_taken_name_as_for_a_free_one(django_user_model, monkeypatch):
    """The answer's time must not tell a taken name either: hashing the password is nearly all of a
    sign-up's work, so the hasher runs exactly once for a taken name, as it does for the account a free
    one makes. Counted, not timed (these machines are shared and noisy). A form refused for another
    reason hashes nothing for either."""
    from django.contrib.auth.hashers import get_hasher

    django_user_model.objects.create_user("taken", password=PASSWORD)
    hasher, hashed = get_hasher("default"), list[str]()
    encode = hasher.encode

    def counted(password: str, salt: str, *args: object, **kwargs: object) -> str:
        hashed.append(password)
        return encode(password, salt, *args, **kwargs)

    monkeypatch.setattr(hasher, "encode", counted)

    def hashings(name: str, password: str = "another-long-pass-7!") -> int:
        before = len(hashed)
        answer = sign_up(name, password=password)
        assert answer.status_code == (302 if len(password) > 1 else 400), answer
        return len(hashed) - before

    free, taken = hashings("free-name"), hashings("taken")
    assert django_user_model.objects.filter(username="free-name").exists(), "liveness: the free name was made"
    assert free == taken == 1, f"a free name hashed {free} times, a taken one {taken}"
    assert hashings("taken", password="a") == hashings("other-free", password="a") == 0

@override_settings(WORKBENCH_SIGNUP="open")
def test_open_sign_up_refuses_weak_passwords_by_name(django_user_model):
    for weak in ("a", "password", "12345678901", "weakling-1"):  # short, common, digits, the username
        answer = sign_up("weakling-1", password=weak)
        assert answer.status_code == 400 and "password2" in answer.context["form"].errors, weak
    assert not django_user_model.objects.filter(username="weakling-1").exists()
    assert sign_up("weakling-1").status_code == 302
