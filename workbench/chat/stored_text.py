"""NUL (U+0000) in what the chat stores. PostgreSQL's text and jsonb cannot hold it (SQLite can), so on
the deployment's database it would fail the write with a DataError; what happens instead depends on
who wrote the text:

- Text a user types (a message, a title, a system prompt, an API token's name, the strings of the
  sampling settings) is refused at the boundary, by name (`nul_refusal`, `nul_in_json`): an
  `invalid_request` the user can act on, and both databases stay alike. The websocket and OpenAI APIs
  store no text and take NUL like any other character.
- Text the model writes (a reply, its error) cannot be refused after the fact, so it is stored escaped
  (`NulEscapedTextField`): NUL as ESCAPE "0" and ESCAPE itself as ESCAPE ESCAPE, undone on every read,
  so the reply read back is the reply streamed, on either database. ESCAPE is a private-use character:
  ordinary text is stored unchanged, byte for byte.
"""

from __future__ import annotations

import re

from django.db import models

NUL = "\x00"
ESCAPE = "\ue000"
_ESCAPED = re.compile(ESCAPE + "([0" + ESCAPE + "])")


def nul_refusal(field: str, text: str) -> str | None:
    """The error message for `text` holding NUL, naming `field`; None when it can be stored."""
    if NUL in text:
        return f"{field}: must not contain NUL (U+0000), which the database cannot store"
    return None


def nul_in_json(value: object) -> bool:
    """Whether NUL is in any string (key or value) of a JSON value: jsonb refuses it as it does in text."""
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, dict):
        return any(nul_in_json(k) or nul_in_json(v) for k, v in value.items())
    if isinstance(value, list):
        return any(nul_in_json(item) for item in value)
    return False


def escaped(text: str) -> str:
    if NUL not in text and ESCAPE not in text:
        return text
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace(NUL, ESCAPE + "0")


def unescaped(stored: str) -> str:
    if ESCAPE not in stored:
        return stored
    return _ESCAPED.sub(lambda m: NUL if m.group(1) == "0" else ESCAPE, stored)


class NulEscapedTextField(models.TextField):
    """A TextField that stores NUL escaped (see the module's docstring). Exact lookups are escaped
    with the value; a pattern lookup (contains, icontains) is not (Django prepares no pattern), so a
    search passes `escaped(query)` itself (workbench/chat/search.py)."""

    def get_prep_value(self, value: object) -> object:
        value = super().get_prep_value(value)
        return escaped(value) if isinstance(value, str) else value

    def from_db_value(self, value: str | None, expression: object, connection: object) -> str | None:
        return None if value is None else unescaped(value)
