"""API tokens: created and revoked by their user, stored only as a SHA-256 digest."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "wb_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)  # shown in lists so a user can tell tokens apart
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}... ({self.user}, {'revoked' if self.revoked_at else 'active'})"

    @classmethod
    def issue(cls, user, name: str = "") -> tuple["ApiToken", str]:
        """A new token for `user`; the plaintext is returned once and never stored."""
        plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, digest=digest(plaintext), prefix=plaintext[:10])
        return token, plaintext

    @classmethod
    def user_for(cls, plaintext: str):
        """The active user a token belongs to, or None."""
        if not plaintext.startswith(TOKEN_PREFIX):
            return None
        token = cls.objects.select_related("user").filter(digest=digest(plaintext), revoked_at__isnull=True).first()
        return token.user if token and token.user.is_active else None

    def revoke(self) -> None:
        """Idempotent: revoking again keeps the time it was first revoked."""
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class ReproduceRecord(models.Model):
    """An API request's reproducibility record (engine/reproduce.py), kept for its own user for
    WORKBENCH_REPRODUCE_RETENTION_S and re-derived by POST /v1/reproduce/{id}."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reproduce_records")
    request_id = models.CharField(max_length=200)  # the id the API answered with (a choice's engine id)
    model = models.CharField(max_length=500)  # the served model's name, as the request chose it
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    record = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "request_id"], name="one_record_per_user_request")]

    def __str__(self) -> str:
        return f"{self.request_id} ({self.user})"


class StoredResponse(models.Model):
    """A /v1/responses reply kept because its request said `store` (OpenAI's default): read back with
    GET /v1/responses/{id} and continued with `previous_response_id`, by its own user only."""

    response_id = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_responses")
    created_at = models.DateTimeField(default=timezone.now)
    response = models.JSONField()  # the Response object, as it was answered
    # The conversation in chat messages, the reply included and the instructions not (OpenAI carries
    # none to a follow-up): what a request naming it as previous_response_id continues.
    conversation = models.JSONField()

    def __str__(self) -> str:
        return f"{self.response_id} ({self.user})"
