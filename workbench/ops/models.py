"""The audit log of runtime flag changes: who asked what of which workers, when, and what each answered."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


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
