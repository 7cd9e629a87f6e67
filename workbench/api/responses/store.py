"""Stored /v1/responses replies (workbench/api/models.py: StoredResponse), each read and deleted only by its
own user: another user's id, like an unknown one, is not found.

Retention (settings.WORKBENCH_RESPONSES_RETENTION_DAYS): a reply older than that reads as not found, and
each store deletes every expired one, so the table holds no more than the period's replies. No
process of its own sweeps them: a server that stores nothing more keeps the expired rows, unread.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from workbench.api.http_api import ApiError
from workbench.api.models import StoredResponse


def _not_found(response_id: str, param: str | None) -> ApiError:
    return ApiError(404, f"No response with id {response_id!r} found.", param=param, code="not_found")


def _kept() -> QuerySet[StoredResponse]:
    """The replies within the retention period (all of them where it is 0)."""
    days = settings.WORKBENCH_RESPONSES_RETENTION_DAYS
    replies = StoredResponse.objects.all()
    return replies.filter(created_at__gte=timezone.now() - timedelta(days=days)) if days else replies


# Expired replies are deleted at most once a minute by a store (reads skip them meanwhile): a delete
# scanning the table on every store would cost every request that stores.
PURGE_EVERY_S = 60.0
_purged_at = [-PURGE_EVERY_S]


@sync_to_async
def save(user: AbstractBaseUser, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
    days = settings.WORKBENCH_RESPONSES_RETENTION_DAYS
    if days and time.monotonic() - _purged_at[0] >= PURGE_EVERY_S:
        _purged_at[0] = time.monotonic()
        StoredResponse.objects.filter(created_at__lt=timezone.now() - timedelta(days=days)).delete()
    StoredResponse.objects.create(response_id=response["id"], user_id=user.pk, response=response, conversation=conversation)


@sync_to_async
def _find(user: AbstractBaseUser, response_id: str) -> StoredResponse | None:
    return _kept().filter(response_id=response_id, user_id=user.pk).first()


@sync_to_async
def _delete(user: AbstractBaseUser, response_id: str) -> bool:
    deleted, _ = _kept().filter(response_id=response_id, user_id=user.pk).delete()
    return deleted > 0


async def delete(user: AbstractBaseUser, response_id: str) -> dict[str, Any]:
    """Delete `user`'s stored reply `response_id` (404 for anyone else's, as for an unknown id)."""
    if not await _delete(user, response_id):
        raise _not_found(response_id, None)
    return {"id": response_id, "object": "response", "deleted": True}


async def response_of(user: AbstractBaseUser, response_id: str) -> dict[str, Any]:
    """The stored Response object `response_id` of `user`'s (404 for anyone else's)."""
    found = await _find(user, response_id)
    if found is None:
        raise _not_found(response_id, None)
    return found.response


async def conversation_of(user: AbstractBaseUser, response_id: str | None) -> list[dict[str, Any]]:
    """The conversation a follow-up of `response_id` continues (none without one; 404 for another user's)."""
    if response_id is None:
        return []
    found = await _find(user, response_id)
    if found is None:
        raise _not_found(response_id, "previous_response_id")
    return found.conversation
