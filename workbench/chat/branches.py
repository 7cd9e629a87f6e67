"""A conversation as a tree of messages, and the branch of it the page shows.

Every message names the message it follows (Message.reply_to): a reply the user message it answers, a
user message the reply (or unanswered message) before it; a conversation's first message follows none.
Messages that follow the same one in the same role are siblings: the versions of a reply (a regenerate
adds one) or of a user message (an edit adds one, forking a new branch from there). Of each set of
siblings one is chosen (Message.shown, stored); the branch shown is the path from the first message
down through the chosen sibling at each step, and it is what the page shows, what the export holds and
what the model continues (Conversation.history).

Pure functions over (id, reply_to_id, role, shown) rows, so the walk costs one query however deep.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Row(NamedTuple):
    id: int
    reply_to_id: int | None
    role: str
    shown: bool


def branch(rows: Iterable[Row]) -> list[int]:
    """The ids along the branch shown, first message first. `rows` in creation order. At each step the
    chosen child (the newest chosen, should two be) is followed; where no child is chosen the branch
    ends (a regenerate's reply not stored yet)."""
    children: dict[int | None, list[Row]] = {}
    for row in rows:
        children.setdefault(row.reply_to_id, []).append(row)
    path: list[int] = []
    at: int | None = None
    seen: set[int] = set()
    while True:
        chosen = next((row for row in reversed(children.get(at, [])) if row.shown), None)
        if chosen is None or chosen.id in seen:  # seen: a cycle only broken data could hold
            return path
        path.append(chosen.id)
        seen.add(chosen.id)
        at = chosen.id


def siblings(rows: Iterable[Row]) -> dict[int, tuple[int, ...]]:
    """Every message's siblings (itself included) by id, oldest first: the versions it is one of."""
    rows = list(rows)
    groups: dict[tuple[int | None, str], list[int]] = {}
    for row in rows:
        groups.setdefault((row.reply_to_id, row.role), []).append(row.id)
    return {row.id: tuple(groups[(row.reply_to_id, row.role)]) for row in rows}
