"""API tokens in the admin: listed, searched, revoked; never reassigned or un-revoked.

A token's user and its revocation are read-only: an edited user would hand a token (and what it can
reach) to someone else, and a cleared revoked_at would bring a leaked token back. Staff revoke with
the list's action, which keeps the time a token was first revoked. Tokens are issued by their user
(the API tokens page) or `manage.py createapitoken`, never here: the admin cannot show the plaintext.
"""

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from workbench.api.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "created_at", "revoked_at")
    list_filter = ("created_at", "revoked_at")
    search_fields = ("prefix", "name", "user__username")
    readonly_fields = ("user", "digest", "prefix", "created_at", "revoked_at")  # the token itself is never stored
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, tokens: QuerySet[ApiToken]) -> None:
        for token in tokens:
            token.revoke()
