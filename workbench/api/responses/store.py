"""Stored /v1/responses replies (workbench/api/models.py: StoredResponse), each read only by its own user:
another user's id, like an unknown one, is not found."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.base_user import AbstractBaseUser

from workbench.api.http_api import ApiError
from workbench.api.models import StoredResponse


def _not_found(response_id: str, param: str | None) -> ApiError:
    return ApiError(404, f"No response with id {response_id!r} found.", param=param, code="not_found")


@sync_to_async
def save(user: AbstractBaseUser, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
    StoredResponse.objects.create(response_id=response["id"], user_id=user.pk, response=response, conversation=conversation)


@sync_to_async
def _find(user: AbstractBaseUser, response_id: str) -> StoredResponse | None:
    return StoredResponse.objects.filter(response_id=response_id, user_id=user.pk).first()


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
