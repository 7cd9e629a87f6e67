"""Client JSON, parsed so that whatever a client sends ends in a clear error, never in a crash later.

JSON's `\\ud800` escapes let a client send strings Python accepts but UTF-8 cannot carry (a lone
surrogate): the tokenizer fails on them, PostgreSQL refuses them, and a reply that echoes one cannot be
encoded, which dropped the socket with every request on it. Such strings are refused here, with where
they were. Deep nesting (json's RecursionError) is refused the same way, and so is an integer longer
than Python converts (sys.get_int_max_str_digits(), 4300 digits by default: past it int() raises a
ValueError, which json.loads passes on, and which is no JSONDecodeError).
"""

from __future__ import annotations

import json
import re
import sys

LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins a valid pair, so any left is alone


class JsonInputError(ValueError):
    def __init__(self, code: str, message: str, partial: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.partial = partial  # the object, when it parsed but was refused (its valid fields help an answer)


def parse_object(raw: str | bytes, what: str = "a frame") -> dict:
    """The JSON object in `raw`; JsonInputError (code invalid_json or invalid_request) otherwise."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise JsonInputError("invalid_json", f"{what} is not valid JSON: {exc}") from None
    except ValueError:  # what else json.loads raises: int()'s refusal of an integer past the limit
        raise JsonInputError("invalid_json", f"{what} holds an integer of more than {sys.get_int_max_str_digits()} "
                                             "digits; no value here needs that many") from None
    except RecursionError:
        raise JsonInputError("invalid_json", f"{what} is nested too deeply") from None
    if not isinstance(value, dict):
        raise JsonInputError("invalid_request", f"{what} must be a JSON object")
    where = lone_surrogate_at(value)
    if where is not None:
        raise JsonInputError("invalid_request", f"{where} is not valid Unicode text: it holds a lone surrogate "
                                                "(an unpaired \\ud800-\\udfff escape)", value)
    return value


def lone_surrogate_at(value) -> str | None:
    """The path (like `params.stop[1]`) of the first string or key holding a lone surrogate, or None."""
    stack = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                return path or "the value"
        elif isinstance(item, dict):
            for key, child in item.items():
                if LONE_SURROGATE.search(key):
                    return f"a key in {path or 'the object'}"
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{n}]") for n, child in enumerate(item))
    return None
