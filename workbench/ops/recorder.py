"""Stores the engines' leak-prevention events and replay-verification checks in the database.

Each web process whose transport is running records what its transport sees of every worker (the
inspection snapshot, engine/host/inspection.py: the latest events and checks, numbered per engine start).
Several web processes see the same workers: the unique constraints keep one row per event, and a row
already stored is skipped.

Only what the snapshots carry can be stored: the latest 64 leak events, the latest 64 checks and the
latest 16 divergent ones, as of each poll (every EVERY_S; for a Celery worker, as of its last
heartbeat). More between two polls than that (ARC_GRAPH_VERIFY_ALWAYS on a fast GPU, a storm of
foreign drops) and the older ones are not stored: the recorder logs how many it missed. The engine's
own counters (/metrics) count every one. Clean checks are pruned to the newest KEEP_CLEAN_CHECKS;
divergent checks and leak events are kept.

Started by the ops app for each transport the serving bridge starts (workbench/ops/apps.py); stopped
by the bridge's shutdown.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from django.db import close_old_connections

log = logging.getLogger(__name__)

EVERY_S = 1.0
KEEP_CLEAN_CHECKS = 20_000
PRUNE_EVERY_S = 60.0


class Recorder:
    def __init__(self, transport) -> None:
        self.transport = transport
        self._events_seen: dict[str, int] = {}  # engine run -> last event number stored
        self._checks_seen: dict[str, int] = {}  # engine run -> last replay number stored
        self._pruned_at = 0.0
        self._last_error: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.record_once()
                self._last_error = None
            except Exception as exc:  # the database away must not stop the recording for good
                if str(exc) != self._last_error:
                    log.warning("recording engine events: %s: %s", type(exc).__name__, exc)
                self._last_error = str(exc)
            self._close_stale_connection()
            self.stopping.wait(EVERY_S)

    @staticmethod
    def _close_stale_connection() -> None:
        # Outside the try above, and guarded on its own: a raise here would end the thread for good.
        try:
            close_old_connections()
        except Exception as exc:
            log.debug("closing the recorder's database connection: %s: %s", type(exc).__name__, exc)

    def record_once(self) -> None:
        from workbench.ops.models import LeakEvent, ReplayCheck  # the app registry is ready by now

        events, checks = [], []
        for worker, view in self.transport.workers_view().items():
            try:
                new_events, new_checks = self._new(worker, view)
            except (KeyError, TypeError, ValueError) as exc:  # one worker's odd snapshot (another version?)
                log.warning("worker %s: unreadable snapshot (%s: %s); its events are not stored",
                            worker, type(exc).__name__, exc)
                continue
            events += new_events
            checks += new_checks
        if events:
            LeakEvent.objects.bulk_create(events, ignore_conflicts=True)
        if checks:
            ReplayCheck.objects.bulk_create(checks, ignore_conflicts=True)
        # Only once stored: a failed write is tried again with the next snapshot.
        for event in events:
            self._events_seen[event.engine_run] = max(self._events_seen.get(event.engine_run, 0), event.number)
        for check in checks:
            self._checks_seen[check.engine_run] = max(self._checks_seen.get(check.engine_run, 0), check.replay)
        if checks and time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
            self._pruned_at = time.monotonic()
            clean = ReplayCheck.objects.filter(divergent=False)
            oldest_kept = clean.order_by("-id").values_list("id", flat=True)[KEEP_CLEAN_CHECKS - 1:KEEP_CLEAN_CHECKS]
            if oldest_kept:
                clean.filter(id__lt=oldest_kept[0]).delete()

    def _new(self, worker: str, view: dict) -> tuple[list, list]:
        from workbench.ops.models import LeakEvent, ReplayCheck

        run, state = view.get("engine_run") or worker, view.get("state") or {}
        seen = self._events_seen.get(run, 0)
        fresh = [e for e in state.get("leak_events", []) if e["number"] > seen]
        if fresh and seen and fresh[0]["number"] > seen + 1:
            log.warning("worker %s: leak events %d-%d came and went between two polls and are not stored",
                        worker, seen + 1, fresh[0]["number"] - 1)
        events = [LeakEvent(worker=worker, engine_run=run, number=e["number"], kind=e["kind"], message=e["message"],
                            dropped=e["dropped"], occurred_at=datetime.fromtimestamp(e["at"], timezone.utc))
                  for e in fresh]
        seen = self._checks_seen.get(run, 0)
        checks = [ReplayCheck(worker=worker, engine_run=run, replay=c["replay"], bucket=c["bucket"], rows=c["rows"],
                              max_abs_delta=c["max_abs_delta"], divergent=c["divergent"],
                              argmax_agrees=c["argmax_agrees"], layer_deltas=c["layer_deltas"],
                              first_divergent_layer=c["first_divergent_layer"])
                  for c in state.get("replay_checks", []) if c["replay"] > seen]
        return events, checks


def start(transport):
    """The bridge's listener: record for this transport on a thread of its own; returns its stop."""
    recorder = Recorder(transport)
    thread = threading.Thread(target=recorder.run, name="ops-recorder", daemon=True)
    thread.start()

    def stop() -> None:
        recorder.stopping.set()
        thread.join(timeout=5)

    return stop
