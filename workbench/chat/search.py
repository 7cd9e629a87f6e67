"""Searching a user's conversations, server side: the titles and the text of every message, the
owner's conversations only (the query starts from Conversation.owned_by)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from workbench.chat.models import Conversation

MAX_QUERY_CHARS = 200
SNIPPET_CHARS = 80  # of message text around the match, to show why a conversation was found


@dataclass(frozen=True)
class Found:
    conversation: Conversation
    snippet: str  # "" when the title matched and no message did


def search(user, query: str) -> list[Found]:
    """The user's conversations whose title or any message contains `query` (case-insensitive), the
    most recently used first, each with a snippet of its first matching message."""
    query = query.strip()[:MAX_QUERY_CHARS]
    if not query:
        return []
    found = (Conversation.owned_by(user)
             .filter(Q(title__icontains=query) | Q(messages__content__icontains=query)).distinct())
    return [Found(c, _snippet(c, query)) for c in found]


def _snippet(conversation: Conversation, query: str) -> str:
    message = conversation.messages.filter(content__icontains=query).first()
    if message is None:
        return ""
    text = " ".join(message.content.split())
    at = text.lower().find(query.lower())
    if at < 0:  # whitespace in the query spanned a line break: show the start
        at = 0
    start = max(0, at - SNIPPET_CHARS // 2)
    end = start + SNIPPET_CHARS
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")
