"""The one reader of the environment for the Django settings: typed, bounded, and strict.

Each variable is read by its kind (`env_str`, `env_int`, `env_float`, `env_bool`, `env_list`) and checked
the same way; a bad value stops the process as it starts, with ImproperlyConfigured saying the variable,
the value and what it must be (`WORKBENCH_HEARTBEAT_S must be a number of seconds > 0, not '0'`),
instead of a worker that misbehaves later.

Unset means the default. An empty value is a value: a bad one for numbers and booleans, the empty list for
a list. For strings it counts as unset, as `DATABASE_URL=` always has (docker compose's `${VAR:-}` passes
empty strings through).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from django.core.exceptions import ImproperlyConfigured

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
# Plain notation only: "1e3", "nan", "inf" and "20ms" are mistakes in a setting, not numbers.
WHOLE = re.compile(r"-?[0-9]+")
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")

Number = TypeVar("Number", int, float)


def refuse(name: str, raw: str, expected: str) -> NoReturn:
    raise ImproperlyConfigured(f"{name} must be {expected}, not {raw!r}")


def env_str(name: str, default: str = "", *, choices: Sequence[str] = (), pattern: str = "",
            expected: str = "") -> str:
    """The variable as a string, one of `choices` if given, matching `pattern` (whole) if given;
    `expected` says in words what the pattern allows. Unset or empty: `default` (a setting that may be
    absent reads `env_str(NAME) or None`)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if choices and raw not in choices:
        refuse(name, raw, f"one of {', '.join(choices)}")
    if pattern and not re.fullmatch(pattern, raw):
        refuse(name, raw, expected or f"a string matching {pattern}")
    return raw


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word not in TRUE + FALSE:
        refuse(name, raw, f"a boolean ({'/'.join(TRUE)} or {'/'.join(FALSE)})")
    return word in TRUE


def env_list(name: str, default: Sequence[str]) -> list[str]:
    """A comma-separated list; blanks around and between the commas are dropped."""
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None,
            unit: str = "") -> int:
    """A whole number within [minimum, maximum] (either bound optional)."""
    return _number(name, default, WHOLE, int, "a whole number", unit, minimum, maximum, positive=False)


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None,
              positive: bool = False, unit: str = "") -> float:
    """A finite decimal number within [minimum, maximum], and above 0 when `positive`."""
    return _number(name, default, DECIMAL, float, "a number", unit, minimum, maximum, positive)


def _number(name: str, default: Number, notation: re.Pattern[str], convert: Callable[[str], Number], noun: str,
            unit: str, minimum: Number | None, maximum: Number | None, positive: bool) -> Number:
    raw = os.environ.get(name)
    if raw is None:
        return default
    expected = f"{noun}{' of ' + unit if unit else ''}{_bounds(minimum, maximum, positive)}"
    if not notation.fullmatch(raw.strip()):
        refuse(name, raw, expected)
    value = convert(raw.strip())
    if (not math.isfinite(value) or (positive and value <= 0) or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        refuse(name, raw, expected)
    return value


def _bounds(minimum: float | None, maximum: float | None, positive: bool) -> str:
    """The range in words, as it follows the noun: " from 1 to 9999", " > 0", " >= 0"."""
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    low = " > 0" if positive else f" >= {minimum}" if minimum is not None else ""
    high = f" <= {maximum}" if maximum is not None else ""
    return low + (" and" if low and high else "") + high
