"""Sign-up, by WORKBENCH_SIGNUP: "open" (anyone who reaches the page), "invite" (with an invite code an
operator made in the admin; the default) or "closed" (operators make accounts: the admin,
`createapitoken`). Passwords pass Django's validators (AUTH_PASSWORD_VALIDATORS), and attempts are
throttled per client address (workbench/accounts/throttle.py).

Which names are taken: in "invite" the code is checked before anything else, so that someone without
a valid code learns nothing of the names or the passwords, only that the code is not valid. In "open"
anyone may send the form, so its answer must not tell a taken name from a free one: a form that is
valid but for its name being taken is answered as a new account is, a redirect to the login page with
the name filled in and a note (signed_up), the password hashed all the same so that the time taken
tells nothing either; no account is made, and no one is signed in by a sign-up, a new account's
maker logs in next. The form's other errors are shown as ever, without the name's. What is left: whoever
then logs in learns whether the account is theirs, at the cost of a sign-up and a sign-in attempt, each
throttled per address (and the sign-in per account too).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from urllib.parse import urlencode

from django.contrib.auth import login
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.hashers import make_password
from django.db import IntegrityError, transaction
from django.forms.utils import ErrorDict
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse

from workbench.accounts import throttle
from workbench.accounts.models import Invite

INVALID_INVITE = "This invite code is not valid: it is mistyped, used up or expired. Ask an operator for one."


class SignupForm(UserCreationForm):
    invite = forms.CharField(max_length=64, help_text="the code an operator gave you")

    def __init__(self, *args: Any, invite_needed: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.invite_needed = invite_needed
        self.name_taken = False  # in "open": found taken, and kept out of the errors
        if not invite_needed:
            del self.fields["invite"]

    def clean_username(self) -> str:
        if self.invite_needed:
            return super().clean_username()
        username = str(self.cleaned_data.get("username") or "")
        self.name_taken = bool(username) and self._meta.model.objects.filter(username__iexact=username).exists()
        return username

    def validate_unique(self) -> None:
        if self.invite_needed:  # in "open" the name is the only unique field: clean_username looked
            super().validate_unique()

    def full_clean(self) -> None:
        if self.is_bound and self.invite_needed and not Invite.usable(self.data.get("invite")).exists():
            # Nothing else is checked: without a valid invite no answer may tell a taken name from a free one.
            self._errors, self.cleaned_data = ErrorDict(), {}
            self.add_error("invite", INVALID_INVITE)
            return
        super().full_clean()


def signup(request: HttpRequest) -> HttpResponse:
    policy = settings.WORKBENCH_SIGNUP
    if policy == "closed":
        return render(request, "registration/signup.html", {"closed": True},
                      status=403 if request.method == "POST" else 200)
    posted = request.method == "POST"
    form = SignupForm(request.POST if posted else None, invite_needed=policy == "invite")
    if not posted:
        return render(request, "registration/signup.html", {"form": form})
    retry_after = throttle.signup_refused(request)
    if retry_after is not None:
        response = render(request, "registration/signup.html", {"form": SignupForm(invite_needed=policy == "invite"),
                                                                "retry_after": -(-retry_after // 60)}, status=429)
        response["Retry-After"] = str(retry_after)
        return response
    throttle.signup_attempted(request)
    if form.is_valid() and policy == "open":
        return _made_or_taken(form)
    if form.is_valid():
        with transaction.atomic():
            # Taken in the sign-up's transaction: the last use goes to one sign-up, and a failed one uses nothing.
            if Invite.take(form.cleaned_data["invite"]):
                user = form.save()
                login(request, user)
                return redirect("conversations")
        form.add_error("invite", INVALID_INVITE)  # its last use went to another sign-up meanwhile
    return render(request, "registration/signup.html", {"form": form}, status=400)


def _made_or_taken(form: SignupForm) -> HttpResponse:
    """An open sign-up's one answer, whether its name was free (the account is made) or taken (nothing is)."""
    username = form.cleaned_data["username"]
    if form.name_taken:
        make_password(form.cleaned_data["password1"])  # the time a new account's hashing takes
    else:
        try:
            with transaction.atomic():
                form.save()
        except IntegrityError:  # taken meanwhile by a sign-up of the same name
            pass
    return HttpResponseRedirect(f"{reverse('login')}?{urlencode({'signed_up': 1, 'username': username})}")
