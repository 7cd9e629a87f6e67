"""The chat page's "reproduce" on a stored reply: re-derive it from its record and say whether every bit
came out the same (workbench/serving/rederive.py). Only the conversation's owner reaches a reply; a
reply of someone else's conversation is a 404 like one that does not exist.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from workbench.chat.models import Conversation, Message
from workbench.serving import limits, served_models
from workbench.serving.rederive import RederiveFailed, rederive


def _reply(user, conversation_id: int, message_id: int) -> Message:
    conversation = Conversation.owned_by(user).filter(pk=conversation_id).first()
    reply = None if conversation is None else conversation.messages.filter(pk=message_id, role="assistant").first()
    if reply is None:
        raise Http404("no such reply")
    return reply


def _failed(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "param": None}}, status=status)


@login_required
@require_POST
async def reproduce(request: HttpRequest, conversation_id: int, message_id: int) -> JsonResponse:
    user = await request.auser()
    reply = await database_sync_to_async(_reply)(user, conversation_id, message_id)
    if reply.reproduce is None:
        return _failed("no_record", "this reply has no reproducibility record (it did not run to its end, "
                                    "or it was stored before records were kept)", 409)
    try:
        answer = await rederive(user.get_username(), reply.reproduce, reply.model)
    except limits.Refused as exc:
        return _failed(exc.code, exc.message, 429 if exc.code == "rate_limited" else 503)
    except served_models.TokenizerUnreadable as exc:
        return _failed("unavailable", exc.message, 503)
    except RederiveFailed as exc:
        return _failed(exc.code, exc.message, {"no_record": 409, "timeout": 504}.get(exc.code, 500))
    return JsonResponse({"message_id": reply.pk, **answer})
