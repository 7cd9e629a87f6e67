"""API requests' reproducibility records: kept per user for WORKBENCH_REPRODUCE_RETENTION_S, found only
by their own user.

The serving layer hands each finished API request's record to `keep` on the stream's loop
(record_keepers.RECORD_KEEPERS); the write runs on a thread, and a lookup that comes before it has landed
(POST /v1/reproduce/{id} right after the reply) waits for it, so a client never races its own record.
Expired records are deleted as new ones are written, at most once every PURGE_EVERY_S in a process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.utils import timezone

from workbench.api.models import ReproduceRecord
from workbench.serving.record_keepers import KeptRecord

log = logging.getLogger(__name__)

PURGE_EVERY_S = 60.0

# Writes under way in this process, by (user name, request id).
_writing: dict[tuple[str, str], asyncio.Future] = {}
_purged_at = [float("-inf")]  # time.monotonic() of this process's last purge


def keep(kept: KeptRecord, record: dict) -> None:
    key = (kept.user, kept.request_id)
    task = asyncio.ensure_future(database_sync_to_async(_store)(kept, record))
    _writing[key] = task
    task.add_done_callback(lambda done: _written(key, done))


def _written(key: tuple[str, str], done: asyncio.Future) -> None:
    if _writing.get(key) is done:
        del _writing[key]
    if not done.cancelled() and done.exception() is not None:
        log.error("keeping the reproducibility record of %s failed: %s", key[1], done.exception())


def _cutoff():
    return timezone.now() - timedelta(seconds=settings.WORKBENCH_REPRODUCE_RETENTION_S)


def _store(kept: KeptRecord, record: dict) -> None:
    user = get_user_model().objects.filter(username=kept.user).first()
    if user is None:  # an internal caller with no account: nobody could ask for it
        return
    if time.monotonic() - _purged_at[0] >= PURGE_EVERY_S:
        _purged_at[0] = time.monotonic()
        ReproduceRecord.objects.filter(created_at__lt=_cutoff()).delete()
    # Engine ids are unique per request (a uuid on the HTTP routes, the socket's id on the websocket API):
    # a plain insert, one query.
    ReproduceRecord.objects.create(user=user, request_id=kept.request_id, model=kept.model, record=record)


async def record_of(user: AbstractBaseUser, request_id: str) -> ReproduceRecord | None:
    """`user`'s own unexpired record of `request_id`; None for anything else (another user's included)."""
    writing = _writing.get((user.get_username(), request_id))
    if writing is not None:
        try:
            await asyncio.shield(writing)
        except Exception:  # the write failed (logged where it ran): the record is then not there, a 404
            pass
    return await database_sync_to_async(
        lambda: ReproduceRecord.objects.filter(user__pk=user.pk, request_id=request_id,
                                               created_at__gte=_cutoff()).first())()
