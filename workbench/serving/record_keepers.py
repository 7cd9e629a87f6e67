"""Who keeps finished requests' reproducibility records: the serving layer stores nothing itself.

limits.Admission hands each finished request's record (engine/reproduce.py, as a dict) to every keeper
here, on the stream's loop; the api app registers the one that stores them (workbench/api/
reproduce_records.py). A module of its own, light to import, so that registering costs AppConfig.ready()
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KeptRecord:
    """Whose record it is: the user (name), the request's id and the served model it chose."""
    user: str
    request_id: str
    model: str


RECORD_KEEPERS: list[Callable[[KeptRecord, dict], None]] = []
