"""A forced tool call that the engine ended before its closing tag (max_tokens, or the model's length),
returned as OpenAI returns one: the call, with its function's name and the arguments generated so far
as a JSON string that may not parse yet, and finish_reason `length`.

A forced call's text is what its grammar (workbench/api/openai/tool_calls.py) lets through, compact and
in order, cut anywhere; this module reads what follows the opening tag:

    <tool_call>\\n{"name":"get_weather","arguments":{"city":"Os

The name is known once it is written whole, at once when tool_choice names the function, and from its
first characters when only one offered function starts with them; a cut before any of that (only with
"required" and several functions) leaves no call to return. The arguments are the text after
`"arguments":` as it stands, or, when they were written whole and only the closing tag is missing, the
same normalized JSON as a complete call's.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

# Compact, as the grammar writes it; a text cut before the name's first character matches none.
_BODY = re.compile(r'\s*\{"name":"(?P<name>[^"\\]*)(?P<named>")?(?:,"arguments":(?P<arguments>.*))?', re.DOTALL)


def cut_call(body: str, choice: str, names: set[str]) -> dict[str, Any] | None:
    """The call in OpenAI's shape of a forced call whose text after the opening tag, `body`, stops
    before the closing one, or None if its function cannot be told yet. `choice`: "required" or the
    function tool_choice names; `names`: the functions offered."""
    found = _BODY.match(body)
    written, whole, arguments = ("", False, "") if found is None else \
        (found.group("name"), bool(found.group("named")), found.group("arguments") or "")
    name = _function(choice, names, written, whole)
    if name is None:
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": _arguments(arguments)}}


def _function(choice: str, names: set[str], written: str, whole: bool) -> str | None:
    if choice != "required":
        return choice  # the one function tool_choice named
    if whole:
        return written if written in names else None
    starting = [name for name in sorted(names) if name.startswith(written)]
    return starting[0] if len(starting) == 1 else None


def _arguments(written: str) -> str:
    try:
        value, _ = json.JSONDecoder().raw_decode(written)
    except ValueError:
        return written  # cut inside them: as generated
    # Whole, and only the call's end is missing: as a complete call carries them (tool_calls._call).
    return json.dumps(value, ensure_ascii=False)
