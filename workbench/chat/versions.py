"""A message's versions: a regenerate keeps the earlier replies to the same user message, an edit the
earlier words of a user message (and the branch that followed them), and the page steps through them
(< 2/3 >). The choice is stored (Message.shown), so it survives a reload, and the model continues from
the branch shown (workbench/chat/branches.py).

Versions follow the same message in the same role (Message.reply_to); they are numbered by when they
were made.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from workbench.chat import branches
from workbench.chat.models import Conversation, Message, ReplyUnderWay


@dataclass(frozen=True)
class Shown:
    message: Message
    version: int  # 1-based, of `versions`
    versions: tuple[int, ...]  # the ids of every version of this message, oldest first

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
    """The messages the page shows (the branch shown), each with its place among its versions (two queries)."""
    rows = conversation.tree()
    versions = branches.siblings(rows)
    messages = conversation.messages.filter(pk__in=branches.branch(rows)).order_by("created_at", "id")
    return [Shown(m, versions[m.pk].index(m.pk) + 1, versions[m.pk]) for m in messages]


def of(conversation: Conversation, message_id: int) -> Shown | None:
    """`message_id` among the shown messages; None if it is not shown (another version is, or it is gone)."""
    return next((s for s in shown(conversation) if s.message.pk == message_id), None)


def show(conversation: Conversation, message_id: int) -> None:
    """Show the version `message_id` of its message (a reply's, or a user message's: its branch) instead
    of the others, and the messages it follows with it, so that it is on the branch shown; below it,
    each step keeps the version last chosen there. Message.DoesNotExist if it is no message of this
    conversation; ReplyUnderWay while a reply is generated (the model must not continue from a branch
    that changes under it)."""
    chosen = Message.objects.get(pk=message_id, conversation=conversation, role__in=("user", "assistant"))
    rows = {row.id: row for row in conversation.tree()}
    claim = conversation.claim_reply()
    if claim is None:
        raise ReplyUnderWay
    try:
        with transaction.atomic():
            conversation.lock()
            at: int | None = chosen.pk
            while at is not None and at in rows:
                row = rows[at]
                conversation.messages.filter(reply_to=row.reply_to_id, role=row.role).update(shown=False)
                conversation.messages.filter(pk=row.id).update(shown=True)
                at = row.reply_to_id
    finally:
        conversation.release_reply(claim)
