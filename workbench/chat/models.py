"""Conversations and their messages. Every query for them goes through `owned_by`, so a conversation
is only ever reached by its owner. What a user's turn does to a conversation (send, regenerate, edit)
is here too, as methods the chat socket calls and tests call without one."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import models
from django.utils import timezone

from workbench.chat.titles import DEFAULT_TITLE, title_from


# A reply's claim on its conversation outlives a server that died mid-reply by at most this long.
REPLY_CLAIM_STALE = timedelta(minutes=10)

# What a user may ask of a conversation: a new message, another reply to the last one, or the last one
# reworded and answered again.
Turn = Literal["send", "regenerate", "edit"]


class ReplyUnderWay(Exception):
    """Another reply to this conversation is being generated (any tab, any web process)."""


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, default=DEFAULT_TITLE)
    # Sent as the template's system message before the turns (history()); empty: none is sent.
    system_prompt = models.TextField(blank=True, default="")
    # The page's sampling settings for this conversation (workbench/chat/preferences.py checks them).
    sampling = models.JSONField(default=dict, blank=True)
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

    @classmethod
    def start(cls, owner) -> Conversation:
        """A new conversation of `owner`, with the system prompt and sampling settings of their default."""
        defaults = ChatDefaults.objects.filter(user=owner).first()
        if defaults is None:
            return cls.objects.create(owner=owner)
        return cls.objects.create(owner=owner, system_prompt=defaults.system_prompt, sampling=defaults.sampling)

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

    def take_turn(self, turn: Turn, content: str | None) -> tuple[list[dict[str, str]], datetime] | None:
        """Claim the conversation for a reply and apply the user's turn to it; returns the history to
        answer and the claim (release it once the reply is stored), or None if there is nothing to
        answer (a regenerate or edit before any message). ReplyUnderWay if a reply is under way (any
        tab); Conversation.DoesNotExist if the conversation is gone. The claim is released unless a
        reply is to follow."""
        claim = self.claim_reply()
        if claim is None:
            raise ReplyUnderWay
        history = None
        try:
            self.refresh_from_db(fields=["system_prompt"])  # saved from the page since the socket opened
            history = self._apply(turn, content)
        finally:
            if history is None:
                self.release_reply(claim)
        return None if history is None else (history, claim)

    def _apply(self, turn: Turn, content: str | None) -> list[dict[str, str]] | None:
        if turn == "send":
            if content is None or not content.strip():
                raise ValueError("a message needs its text")  # the socket checks it first (chat/frames.py)
            self.messages.create(role="user", content=content)
        elif not self._rewind(content if turn == "edit" else None):
            return None
        self.updated_at = timezone.now()
        self.save(update_fields=["updated_at"])
        return self.history()

    def add_reply(self, **fields: object) -> Message:
        """Store a reply; the first one titles a conversation still untitled, from the first user message
        (workbench/chat/titles.py). The title is written only if it is still the default when the
        reply is stored, so a rename in another tab meanwhile is kept."""
        reply = self.messages.create(role="assistant", reply_to=self.messages.filter(role="user").last(), **fields)
        first = self.messages.filter(role="user").first() if self.title == DEFAULT_TITLE else None
        if first is not None:
            title = title_from(first.content)
            if Conversation.objects.filter(pk=self.pk, title=DEFAULT_TITLE).update(title=title):
                self.title = title
        return reply

    def _rewind(self, new_content: str | None) -> bool:
        """Set the replies to the last user message aside for another: a regenerate keeps them as
        earlier versions (workbench/chat/versions.py), not shown; an edit (`new_content`) rewords the
        message and drops them, as they answered other words. False (and nothing changed) if there is
        no user message."""
        last_user = self.messages.filter(role="user").last()
        if last_user is None:
            return False
        replies = self.messages.filter(created_at__gte=last_user.created_at, role="assistant")
        if new_content is None:
            replies.update(shown=False)
            return True
        replies.delete()
        last_user.content = new_content
        last_user.save(update_fields=["content"])
        return True

    def history(self) -> list[dict[str, str]]:
        """The conversation as chat-template messages, oldest first. A reply that failed before any
        text (stored so the page shows the error) is not part of what the model is asked to continue.
        The system prompt, if any, leads as the template's system message (fitting keeps it). Of a
        reply's versions, the one shown on the page is the one the model continues from."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + [{"role": m.role, "content": m.content} for m in self.shown_messages()
                         if not (m.role == "assistant" and m.finish_reason == "error" and not m.content)]

    def shown_messages(self) -> models.QuerySet[Message]:
        """The messages as the page shows them: of each reply's versions, the one chosen."""
        return self.messages.filter(shown=True).order_by("created_at", "id")


class Message(models.Model):
    ROLES = [("system", "system"), ("user", "user"), ("assistant", "assistant")]
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=ROLES)
    content = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    # A reply's versions (each regenerate adds one) share the user message they answer; one of them is
    # shown, and only it is part of the history the model continues (workbench/chat/versions.py).
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies")
    shown = models.BooleanField(default=True)
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


class ChatDefaults(models.Model):
    """A user's default system prompt and sampling settings: what their new conversations start from."""
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_defaults")
    system_prompt = models.TextField(blank=True, default="")
    sampling = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"chat defaults of {self.user}"
