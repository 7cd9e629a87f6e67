"""Conversations and their messages. Every query for them goes through `owned_by`, so a conversation
is only ever reached by its owner. What a user's turn does to a conversation (send, regenerate, edit)
is here too, as methods the chat socket calls and tests call without one."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import connection, models, transaction
from django.utils import timezone

from workbench.chat import branches
from workbench.chat.stored_text import NulEscapedTextField
from workbench.chat.titles import DEFAULT_TITLE, title_from


# A reply's claim on its conversation outlives a server that died mid-reply by at most this long.
REPLY_CLAIM_STALE = timedelta(minutes=10)

# What a user may ask of a conversation: a new message, another reply to the last one, or one of its
# messages reworded (a new branch from there) and answered again.
Turn = Literal["send", "regenerate", "edit"]


class ReplyUnderWay(Exception):
    """Another reply to this conversation is being generated (any tab, any web process)."""


class NotShown(Exception):
    """An edit named a message that is no user message of the branch shown."""


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

    def take_turn(self, turn: Turn, content: str | None, message_id: int | None = None,
                  ) -> tuple[list[dict[str, str]], datetime] | None:
        """Claim the conversation for a reply and apply the user's turn to it; returns the history to
        answer and the claim (release it once the reply is stored), or None if there is nothing to
        answer (a regenerate or edit before any message). An edit rewords the user message
        `message_id` (default: the last one shown) as a new version of it, a new branch from there.
        ReplyUnderWay if a reply is under way (any tab); Conversation.DoesNotExist if the
        conversation is gone; NotShown if `message_id` is no user message the page shows. The claim
        is released unless a reply is to follow."""
        claim = self.claim_reply()
        if claim is None:
            raise ReplyUnderWay
        history = None
        try:
            self.refresh_from_db(fields=["system_prompt"])  # saved from the page since the socket opened
            with transaction.atomic():
                self.lock()
                history = self._apply(turn, content, message_id)
        finally:
            if history is None:
                self.release_reply(claim)
        return None if history is None else (history, claim)

    def _apply(self, turn: Turn, content: str | None, message_id: int | None) -> list[dict[str, str]] | None:
        shown = list(self.shown_messages())
        if turn == "send":
            if content is None or not content.strip():
                raise ValueError("a message needs its text")  # the socket checks it first (chat/frames.py)
            shown.append(self.messages.create(role="user", content=content, reply_to=shown[-1] if shown else None))
        elif turn == "regenerate":
            # The earlier replies stay shown until the new one is stored (add_reply sets them aside).
            at = _last_user(shown)
            if at is None:
                return None
            shown = shown[:at + 1]
        else:
            at = _last_user(shown) if message_id is None else next(
                (n for n, m in enumerate(shown) if m.pk == message_id and m.role == "user"), None)
            if at is None:
                if message_id is None:
                    return None
                raise NotShown(f"message {message_id} is no message of yours shown in this conversation")
            shown = shown[:at] + [self._reword(shown[at], content or "")]
        self.updated_at = timezone.now()
        self.save(update_fields=["updated_at"])
        return self._as_history(shown)

    def _reword(self, message: Message, content: str) -> Message:
        """A new version of the user message `message` with `content`, chosen in its place: the branch
        from the old words is kept, one `<` away (workbench/chat/versions.py)."""
        self.messages.filter(reply_to=message.reply_to_id, role="user").update(shown=False)
        return self.messages.create(role="user", content=content, reply_to_id=message.reply_to_id)

    def add_reply(self, **fields: object) -> Message:
        """Store a reply to the last user message shown, chosen in place of its earlier versions (a
        regenerate's); the first reply titles a conversation still untitled, from the first user
        message (workbench/chat/titles.py). The title is written only if it is still the default when
        the reply is stored, so a rename in another tab meanwhile is kept."""
        with transaction.atomic():
            self.lock()
            shown = list(self.shown_messages())
            at = _last_user(shown)
            asked = None if at is None else shown[at]
            if asked is not None:
                self.messages.filter(reply_to=asked, role="assistant").update(shown=False)
            reply = self.messages.create(role="assistant", reply_to=asked, **fields)
        first = shown[0] if shown and self.title == DEFAULT_TITLE else None
        if first is not None:
            title = title_from(first.content)
            if Conversation.objects.filter(pk=self.pk, title=DEFAULT_TITLE).update(title=title):
                self.title = title
        return reply

    def lock(self) -> None:
        """Within a transaction, as its first statement: hold this conversation's row until it commits, so
        that the branch read and the messages written are one step against any other writer of the
        conversation (a reply whose claim went stale and a new turn). PostgreSQL: the row's lock.
        SQLite, which locks the whole database for a write: its write lock, taken now by a write that
        changes nothing. A transaction that reads first cannot wait for another writer when it then
        writes (SQLite fails it at once with "database is locked"); one whose first statement writes
        waits its turn. Conversation.DoesNotExist if it is gone."""
        if connection.vendor == "sqlite":
            if not Conversation.objects.filter(pk=self.pk).update(replying_since=models.F("replying_since")):
                raise Conversation.DoesNotExist
            return
        Conversation.objects.select_for_update().only("pk").get(pk=self.pk)

    def history(self) -> list[dict[str, str]]:
        """The branch shown as chat-template messages, oldest first (workbench/chat/branches.py)."""
        return self._as_history(list(self.shown_messages()))

    def _as_history(self, shown: list[Message]) -> list[dict[str, str]]:
        """A reply that failed before any text (stored so the page shows the error) is not part of what
        the model is asked to continue. The system prompt, if any, leads as the template's system
        message (fitting keeps it)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + [{"role": m.role, "content": m.content} for m in shown
                         if not (m.role == "assistant" and m.finish_reason == "error" and not m.content)]

    def tree(self) -> list[branches.Row]:
        """Every message's place in the conversation's tree, in creation order (one query)."""
        return [branches.Row(*values) for values in
                self.messages.order_by("created_at", "id").values_list("id", "reply_to_id", "role", "shown")]

    def shown_messages(self) -> models.QuerySet[Message]:
        """The messages as the page shows them: the branch shown, of each message's versions the one
        chosen, in order."""
        return self.messages.filter(pk__in=branches.branch(self.tree())).order_by("created_at", "id")


def _last_user(messages: list[Message]) -> int | None:
    return next((n for n in range(len(messages) - 1, -1, -1) if messages[n].role == "user"), None)


class Message(models.Model):
    ROLES = [("system", "system"), ("user", "user"), ("assistant", "assistant")]
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=ROLES)
    # A reply holds what the model wrote, NUL included (stored escaped: workbench/chat/stored_text.py).
    content = NulEscapedTextField()
    created_at = models.DateTimeField(default=timezone.now)
    # The message this one follows (a reply: the user message it answers; a user message: the message
    # before it; None: a first message). Siblings are versions (a regenerate, an edit); `shown` marks the
    # one chosen, and the branch through the chosen ones is the conversation (workbench/chat/branches.py).
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies")
    shown = models.BooleanField(default=True)
    # Assistant replies only: how the generation ended, and what it cost.
    finish_reason = models.CharField(max_length=16, blank=True)
    error = NulEscapedTextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Of prompt_tokens, those whose keys/values the engine's prefix cache already held (the conversation
    # so far, from the last turn); None for replies stored before it was kept.
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    time_to_first_token = models.FloatField(null=True, blank=True)
    decode_tokens_per_s = models.FloatField(null=True, blank=True)
    # The model that wrote it (workers may host different ones; the page's selector chooses). Blank:
    # stored before the deployment said, which was then WORKBENCH_MODEL. The database default lets rows be
    # written without it (an older web process during a rolling upgrade; the page tests' stored replies).
    model = models.CharField(max_length=500, blank=True, default="", db_default="")
    # What re-deriving the reply needs (engine/reproduce.py); None: it did not run to its end, or was
    # stored before records were kept.
    reproduce = models.JSONField(null=True, blank=True)

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
