"""What the chat refuses in the text it stores (messages, titles, system prompts): NUL (U+0000).

PostgreSQL's text columns cannot hold it (SQLite can), so a deployment on PostgreSQL would fail to store
such a message with a database error; refusing it everywhere, by name, keeps both databases alike and
the error structured. The websocket and OpenAI APIs store no text and take NUL as any other character.
"""

from __future__ import annotations

NUL = "\x00"


def nul_refusal(field: str, text: str) -> str | None:
    """The error message for `text` holding NUL, naming `field`; None when it can be stored."""
    if NUL in text:
        return f"{field}: must not contain NUL (U+0000), which the database cannot store"
    return None
