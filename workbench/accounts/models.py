"""Invite codes: made by an operator in the admin, each good for a number of sign-ups until it expires,
when WORKBENCH_SIGNUP is "invite" (workbench/accounts/signup.py)."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


def new_code() -> str:
    """128 random bits: an invite cannot be guessed, only given."""
    return secrets.token_urlsafe(16)


class Invite(models.Model):
    code = models.CharField(max_length=64, unique=True, default=new_code)
    note = models.CharField(max_length=200, blank=True, help_text="whom it is for (shown to operators only)")
    uses_left = models.PositiveIntegerField(default=1, help_text="sign-ups it still allows")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="empty: never")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.code[:6]}... ({self.uses_left} left{', ' + self.note if self.note else ''})"

    @classmethod
    def usable(cls, code: object) -> models.QuerySet[Invite]:
        """The invite `code` names while it allows a sign-up (empty when it does not)."""
        if not isinstance(code, str) or not code:
            return cls.objects.none()
        return cls.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()), code=code,
                                  uses_left__gt=0)

    @classmethod
    def take(cls, code: str) -> bool:
        """Uses the invite once, in one conditional UPDATE (two sign-ups at once cannot both take the last
        use); False when it allows no more. Call it in the sign-up's transaction."""
        return cls.usable(code).update(uses_left=F("uses_left") - 1) == 1
