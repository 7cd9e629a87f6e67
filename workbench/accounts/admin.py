"""Invite codes in the admin: an operator adds one (the code is made for it) and passes it on."""

from django.contrib import admin
from django.http import HttpRequest

from workbench.accounts.login import ThrottledAdminLoginForm
from workbench.accounts.models import Invite

# The admin's own login is throttled like /login (workbench/accounts/login.py).
admin.site.login_form = ThrottledAdminLoginForm


@admin.register(Invite)
class InviteAdmin(admin.ModelAdmin):
    list_display = ("code", "note", "uses_left", "expires_at", "created_by", "created_at")
    search_fields = ("code", "note")
    readonly_fields = ("code", "created_by", "created_at")

    def save_model(self, request: HttpRequest, obj: Invite, form: object, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
