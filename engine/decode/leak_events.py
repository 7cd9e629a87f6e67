"""The leak-prevention events an operator must see: each time a mechanism stopped a token from reaching
the wrong sequence.

Two mechanisms catch something in the act rather than preventing it silently: the owner tag (a parked
slot taken by a sequence that does not own it is dropped whole) and the logits identity check (logits
computed for some sequences about to be sampled for others fails the step). Each catch is numbered, so
a reader polling the log (the dashboard, the recorder that stores them) takes only what is new.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import asdict, dataclass

FOREIGN_PARKED_DROPPED = "foreign_parked_dropped"
ALIASED_LOGITS = "aliased_logits"
# A finished request re-run alone gave other bits on a bit-invariant route (engine/host/replay_audit.py).
REPLAY_MISMATCH = "replay_mismatch"


@dataclass(frozen=True)
class LeakEvent:
    number: int  # 1, 2, ... per engine
    kind: str    # FOREIGN_PARKED_DROPPED, ALIASED_LOGITS or REPLAY_MISMATCH
    message: str
    dropped: int  # tokens dropped (foreign parked tokens); 0 for an aliased-logits step error
    at: float     # time.time()

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class LeakEventLog:
    def __init__(self, keep: int = 256) -> None:
        self._events: deque[LeakEvent] = deque(maxlen=keep)
        self._numbers = itertools.count(1)

    def record(self, kind: str, message: str, dropped: int = 0) -> LeakEvent:
        event = LeakEvent(next(self._numbers), kind, message, dropped, time.time())
        self._events.append(event)
        return event

    def recent(self, limit: int | None = None) -> list[LeakEvent]:
        events = list(self._events)
        return events if limit is None else events[-limit:]

    def since(self, cursor: int) -> tuple[list[LeakEvent], int]:
        """The events numbered after `cursor` that the log still keeps (0: every one kept), and the
        cursor to pass next time. A reader that fell more than `keep` events behind gets the newest."""
        events = [event for event in self._events if event.number > cursor]
        return events, max(cursor, self.last_number)

    @property
    def last_number(self) -> int:
        return self._events[-1].number if self._events else 0
