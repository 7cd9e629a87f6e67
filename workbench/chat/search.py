"""Searching a user's conversations, server side: the titles and the text of the messages the page
shows, the owner's conversations only (the query starts from Conversation.owned_by).

Decision: a message matches only if it is on the branch shown (of a reply's versions the one chosen, of
an edited message's branches the one chosen). A result opens the conversation as it is shown, so a
match in a hidden version would send the user to a page without the words they searched for."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from workbench.chat.models import Conversation, Message
from workbench.chat.stored_text import NUL, escaped

MAX_QUERY_CHARS = 200
SNIPPET_CHARS = 80  # of message text around the match, to show why a conversation was found


@dataclass(frozen=True)
class Found:
    conversation: Conversation
    snippet: str  # "" when the title matched and no message did


def search(user, query: str) -> list[Found]:
    """The user's conversations whose title or any message shown contains `query` (case-insensitive),
    the most recently used first, each with a snippet of its first matching message shown."""
    query = query.strip()[:MAX_QUERY_CHARS]
    if not query:
        return []
    # Message text is stored NUL-escaped and a pattern is not escaped for us; titles never hold NUL
    # (refused when typed), and PostgreSQL refuses a NUL in any query parameter.
    in_text = escaped(query)
    matches = Q(messages__content__icontains=in_text)
    if NUL not in query:
        matches |= Q(title__icontains=query)
    # Any message, in SQL; then only those whose match is shown (a walk per candidate, not per conversation).
    candidates = Conversation.owned_by(user).filter(matches).distinct()
    found = []
    for conversation in candidates:
        message = conversation.shown_messages().filter(content__icontains=in_text).first()
        if message is not None or query.lower() in conversation.title.lower():
            found.append(Found(conversation, "" if message is None else _snippet(message, query)))
    return found


def _snippet(message: Message, query: str) -> str:
    text = " ".join(message.content.split())
    at = text.lower().find(query.lower())
    if at < 0:  # whitespace in the query spanned a line break: show the start
        at = 0
    start = max(0, at - SNIPPET_CHARS // 2)
    end = start + SNIPPET_CHARS
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")
