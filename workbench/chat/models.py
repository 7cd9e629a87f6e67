"""Conversations and their messages. Every query for them goes through `owned_by`, so a conversation
is only ever reached by its owner."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


# A reply's claim on its conversation outlives a server that died mid-reply by at most this long.
REPLY_CLAIM_STALE = timedelta(minutes=10)


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, default="New conversation")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # Set while a reply is generated: one reply at a time per conversation, whichever tab or web process
    # asks (two at once stored their messages interleaved: question, question, answer, answer).
    replying_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return f"{self.title} ({self.owner})"

    @classmethod
    def owned_by(cls, user):
        return cls.objects.filter(owner=user) if user.is_authenticated else cls.objects.none()

    def claim_reply(self) -> datetime | None:
        """Atomically mark a reply as under way; returns the claim (None: one is already under way).
        Raises Conversation.DoesNotExist if the conversation is gone."""
        now = timezone.now()
        free = models.Q(replying_since__isnull=True) | models.Q(replying_since__lt=now - REPLY_CLAIM_STALE)
        if Conversation.objects.filter(free, pk=self.pk).update(replying_since=now):
            return now
        if not Conversation.objects.filter(pk=self.pk).exists():
            raise Conversation.DoesNotExist
        return None

    def release_reply(self, claim: datetime) -> None:
        Conversation.objects.filter(pk=self.pk, replying_since=claim).update(replying_since=None)

    def history(self) -> list[dict]:
        """The conversation as chat-template messages, oldest first. A reply that failed before any
        text (stored so the page shows the error) is not part of what the model is asked to continue."""
        return [{"role": m.role, "content": m.content} for m in self.messages.order_by("created_at", "id")
                if not (m.role == "assistant" and m.finish_reason == "error" and not m.content)]


class Message(models.Model):
    ROLES = [("system", "system"), ("user", "user"), ("assistant", "assistant")]
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=ROLES)
    content = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    # Assistant replies only: how the generation ended, and what it cost.
    finish_reason = models.CharField(max_length=16, blank=True)
    error = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    time_to_first_token = models.FloatField(null=True, blank=True)
    decode_tokens_per_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"
