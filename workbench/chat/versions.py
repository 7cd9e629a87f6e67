"""A reply's versions: a regenerate keeps the earlier replies to the same user message, and the page
steps through them (< 2/3 >). The choice is stored (Message.shown), so it survives a reload, and the
model continues from the version shown (Conversation.history reads only shown messages).

Versions share the user message they answer (Message.reply_to); they are numbered by when they were
made. A reply stored before versions existed answers no recorded message and has only itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from workbench.chat.models import Conversation, Message, ReplyUnderWay


@dataclass(frozen=True)
class Shown:
    message: Message
    version: int  # 1-based, of `versions`
    versions: tuple[int, ...]  # the ids of every version of this reply, oldest first

    @property
    def previous_id(self) -> int | None:
        return self.versions[self.version - 2] if self.version > 1 else None

    @property
    def next_id(self) -> int | None:
        return self.versions[self.version] if self.version < len(self.versions) else None

    def as_frame(self) -> dict[str, object]:
        return {"version": self.version, "count": len(self.versions), "previous": self.previous_id,
                "next": self.next_id}


def shown(conversation: Conversation) -> list[Shown]:
    """The messages the page shows, each reply with its place among its versions (two queries)."""
    messages = list(conversation.shown_messages())
    asked = [m.reply_to_id for m in messages if m.reply_to_id is not None]
    versions: dict[int, list[int]] = {}
    for reply_to, pk in (Message.objects.filter(reply_to__in=asked, role="assistant")
                         .order_by("created_at", "id").values_list("reply_to", "id")):
        if reply_to is not None:
            versions.setdefault(reply_to, []).append(pk)
    result = []
    for m in messages:
        ids = tuple(versions.get(m.reply_to_id, [m.pk])) if m.reply_to_id is not None else (m.pk,)
        result.append(Shown(m, ids.index(m.pk) + 1, ids))
    return result


def of(conversation: Conversation, message_id: int) -> Shown | None:
    """`message_id` among the shown messages; None if it is not shown (another version is, or it is gone)."""
    return next((s for s in shown(conversation) if s.message.pk == message_id), None)


def show(conversation: Conversation, message_id: int) -> None:
    """Show the version `message_id` of its reply instead of the others. Message.DoesNotExist if it is
    no reply of this conversation; ReplyUnderWay while a reply is generated (it may be this one's next
    version, and the model must not continue from a version that changes under it)."""
    chosen = Message.objects.get(pk=message_id, conversation=conversation, role="assistant")
    claim = conversation.claim_reply()
    if claim is None:
        raise ReplyUnderWay
    try:
        with transaction.atomic():
            if chosen.reply_to_id is not None:
                Message.objects.filter(reply_to=chosen.reply_to_id, role="assistant").update(shown=False)
            Message.objects.filter(pk=chosen.pk).update(shown=True)
    finally:
        conversation.release_reply(claim)
