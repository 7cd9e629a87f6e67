"""What operators look back on: the audit logs of runtime flag changes and of requests canceled by an
operator, and the engines' leak-prevention events and replay-verification checks (stored by
workbench/ops/recorder.py from the workers' snapshots)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from engine.decode.leak_events import ALIASED_LOGITS, FOREIGN_PARKED_DROPPED, REPLAY_MISMATCH


class FlagChange(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="flag_changes")
    name = models.CharField(max_length=64)
    value = models.JSONField()
    all_workers = models.BooleanField(default=False)  # also applies to workers that start later
    workers = models.JSONField(default=list)  # the worker ids asked
    answers = models.JSONField(default=dict)  # worker id -> {"in_force": {...}} or {"error": "..."}
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("flip_flags", "Can change the engine's runtime flags")]

    def __str__(self) -> str:
        return f"{self.name}={self.value} by {self.user} ({'all workers' if self.all_workers else ', '.join(self.workers)})"

    @property
    def refused_by(self) -> list[str]:
        return sorted(worker for worker, answer in self.answers.items() if "error" in answer)


class RequestCancel(models.Model):
    """An operator's cancel of a request from the dashboard (workbench/ops/request_cancels.py)."""
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="request_cancels")
    worker = models.CharField(max_length=128)
    request_id = models.CharField(max_length=256)  # the engine's id on that worker, as the dashboard shows it
    owner = models.CharField(max_length=150, blank=True)  # whom the request served, as the dashboard showed
    error = models.TextField(blank=True)  # why it was not sent (no such request...); empty: sent
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        outcome = f"refused: {self.error}" if self.error else "sent"
        return f"cancel {self.request_id} on {self.worker} by {self.user} ({outcome})"


class LeakEvent(models.Model):
    """One catch by the owner tag (foreign parked tokens dropped), the logits identity check, or the replay
    audit (a request re-run alone came out different on a bit-invariant route)."""
    KINDS = [(FOREIGN_PARKED_DROPPED, "foreign parked tokens dropped"), (ALIASED_LOGITS, "aliased-logits step error"),
             (REPLAY_MISMATCH, "re-run alone differs")]
    worker = models.CharField(max_length=128)
    engine_run = models.CharField(max_length=32)  # the engine's start: numbers count from 1 per start
    number = models.PositiveIntegerField()
    kind = models.CharField(max_length=32, choices=KINDS)
    message = models.TextField()
    dropped = models.PositiveIntegerField(default=0)
    occurred_at = models.DateTimeField()

    class Meta:
        ordering = ["-occurred_at"]
        # Every web process records what it sees; the constraint keeps one row per event.
        constraints = [models.UniqueConstraint(fields=["engine_run", "number"], name="one_row_per_leak_event")]

    def __str__(self) -> str:
        return f"{self.worker}: {self.message}"


class ReplayCheck(models.Model):
    """One graph replay verified against the eager forward of the same inputs (engine/decode/graphs.py)."""
    worker = models.CharField(max_length=128)
    engine_run = models.CharField(max_length=32)
    replay = models.PositiveBigIntegerField()
    bucket = models.PositiveIntegerField()
    rows = models.PositiveIntegerField()
    max_abs_delta = models.FloatField(null=True)  # empty: not finite (the replay or the eager step gave NaN/inf)
    divergent = models.BooleanField()  # anything but an exact match
    argmax_agrees = models.BooleanField()
    layer_deltas = models.JSONField(null=True, blank=True)
    first_divergent_layer = models.IntegerField(null=True, blank=True)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-recorded_at", "-replay"]
        constraints = [models.UniqueConstraint(fields=["engine_run", "replay"], name="one_row_per_replay_check")]

    def __str__(self) -> str:
        delta = "not finite" if self.max_abs_delta is None else f"{self.max_abs_delta:.3g}"
        return f"{self.worker} replay {self.replay}: max |delta| {delta}"
