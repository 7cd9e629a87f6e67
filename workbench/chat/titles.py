"""A conversation's title from its first exchange: the first words of the first user message.

Set when the first reply is stored (Conversation.add_reply), not when the message is sent, so a message
refused before it was answered names nothing. The model is not asked for a title: on the small models
served here its summary reads worse than the user's own words, and it would cost a second generation.
"""

from __future__ import annotations

DEFAULT_TITLE = "New conversation"
# Long enough for a question's gist, short enough for one line of the conversation list.
MAX_TITLE_CHARS = 60
MAX_RENAME_CHARS = 200  # Conversation.title's column


def title_from(message: str) -> str:
    """The first words of the message's first line that fit in MAX_TITLE_CHARS, cut at a word boundary
    with an ellipsis when words of it were left out (a pasted block after the first line is no title)."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    words = lines[0].split() if lines else []
    title = ""
    for word in words:
        candidate = f"{title} {word}" if title else word
        if len(candidate) > MAX_TITLE_CHARS:
            # A single word longer than the limit is cut inside it rather than giving no title.
            return (title or word[:MAX_TITLE_CHARS - 1]) + "…"
        title = candidate
    return title or DEFAULT_TITLE
