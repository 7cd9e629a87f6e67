"""Signing in, throttled (workbench/accounts/throttle.py): /login and the admin's login check the
throttle before the password, count each failure, and clear the account's count on success.

At its limit the form answers "too many failed sign-ins" whatever the password, and /login answers it
with status 429 and Retry-After.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpResponse

from workbench.accounts import throttle


def _minutes(seconds: int) -> str:
    minutes = -(-seconds // 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


class _Throttled:
    """The throttle around AuthenticationForm.clean (which authenticates)."""

    request: Any
    cleaned_data: dict[str, Any]
    retry_after: int | None = None

    def clean(self) -> dict[str, Any]:
        username = str(self.cleaned_data.get("username") or "")
        self.retry_after = throttle.login_refused(self.request, username)
        if self.retry_after is not None:
            raise forms.ValidationError(f"Too many failed sign-ins for this account or from this address; try "
                                        f"again in {_minutes(self.retry_after)}.", code="throttled")
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            throttle.login_failed(self.request, username)
            raise
        throttle.login_succeeded(username)
        return cleaned


class ThrottledLoginForm(_Throttled, AuthenticationForm):
    pass


class ThrottledAdminLoginForm(_Throttled, AdminAuthenticationForm):
    pass


class LoginPage(LoginView):
    authentication_form = ThrottledLoginForm

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "signup": settings.WORKBENCH_SIGNUP,
                "signed_up": "signed_up" in self.request.GET}

    def get_initial(self) -> dict[str, Any]:
        # An open sign-up sends its maker here with the name they chose (workbench/accounts/signup.py).
        username = self.request.GET.get("username", "")
        return {**super().get_initial(), **({"username": username[:150]} if username else {})}

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_invalid(form)
        retry_after = getattr(form, "retry_after", None)
        if retry_after is not None:
            response.status_code = 429
            response["Retry-After"] = str(retry_after)
        return response
