"""The parked queue: a device-loop burst's tokens waiting to be drained, one owner-tagged slot per row.

A burst parks each row's tokens in the slot of its decode-batch row (the device ring's layout),
stamped with the sequence that owns them. `take(row, seq_id)` returns Taken | Empty | Foreign: a slot
owned by anyone else is dropped whole and logged ("dropped N foreign parked tokens"). That owner tag is
the defence no funnel can give: a scheduler may move a running sequence aside without a state change
(the bucket scheduler's waitlist, batch growth) and put another sequence at its row.

Slots are looked up by row, not by sequence id: a lookup by sequence id could never see a foreign slot,
so the owner tag would guard nothing.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from engine.decode.leak_events import FOREIGN_PARKED_DROPPED, LeakEventLog

log = logging.getLogger("engine.decode.device_loop")  # the operator's log line keeps the device loop's logger


@dataclass(frozen=True)
class Taken:
    token: int


@dataclass(frozen=True)
class Empty:
    pass


@dataclass(frozen=True)
class Foreign:
    dropped: int


TakeResult = Taken | Empty | Foreign


@dataclass
class _Slot:
    owner: int
    tokens: deque[int]


class ParkedQueue:
    """Parked burst tokens, one owner-tagged slot per decode-batch row."""

    def __init__(self, events: LeakEventLog | None = None) -> None:
        self._slots: dict[int, _Slot] = {}
        self.events = events if events is not None else LeakEventLog()
        self.foreign_dropped = 0  # tokens dropped by the owner check, for the dashboard and metrics
        self.taken = 0            # tokens drained by their owner

    def park(self, row: int, owner: int, tokens: list[int]) -> None:
        self._slots[row] = _Slot(owner, deque(tokens))

    def holds(self, row: int, seq_id: int) -> bool:
        """Whether `take(row, seq_id)` would return Taken; changes nothing."""
        slot, owned = self._lookup(row, seq_id)
        return slot is not None and owned

    def take(self, row: int, seq_id: int) -> TakeResult:
        slot, owned = self._lookup(row, seq_id)
        if slot is None:
            return Empty()
        if not owned:
            dropped = len(slot.tokens)
            del self._slots[row]
            self.foreign_dropped += dropped
            message = (f"dropped {dropped} foreign parked tokens (row {row} owned by seq {slot.owner}, "
                       f"taken by seq {seq_id})")
            self.events.record(FOREIGN_PARKED_DROPPED, message, dropped)
            log.warning("ArcGraph: %s", message)
            return Foreign(dropped)
        self.taken += 1
        return Taken(slot.tokens.popleft())

    def _lookup(self, row: int, seq_id: int) -> tuple[_Slot | None, bool]:
        """The row's slot if it holds tokens, and whether `seq_id` owns it: the owner tag, in one place."""
        slot = self._slots.get(row)
        if slot is None or not slot.tokens:
            return None, False
        return slot, slot.owner == seq_id

    def drop_owners(self, seq_ids: set[int]) -> int:
        rows = [row for row, slot in self._slots.items() if slot.owner in seq_ids]
        dropped = sum(len(self._slots[row].tokens) for row in rows)
        for row in rows:
            del self._slots[row]
        return dropped

    def clear(self) -> int:
        dropped = self.pending()
        self._slots.clear()
        return dropped

    def pending(self, seq_id: int | None = None) -> int:
        return sum(len(s.tokens) for s in self._slots.values() if seq_id is None or s.owner == seq_id)

    def slots(self) -> dict[int, tuple[int, int]]:
        """Row -> (owner seq id, tokens still parked there), for the dashboard."""
        return {row: (slot.owner, len(slot.tokens)) for row, slot in self._slots.items() if slot.tokens}
