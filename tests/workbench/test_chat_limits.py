"""The chat socket under the request limits (workbench/serving/limits.py): a turn refused by one gets
an error frame with `retry_after` and stores nothing of that turn; the user's next turn, once the limit
allows, is answered."""

from __future__ import annotations


import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from tests.workbench.test_chat import as_user, talk
from workbench.chat.models import Conversation

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

PARAMS = {"temperature": 0, "max_tokens": 2, "ignore_eos": True}


async def test_a_chat_turn_refused_by_a_limit_is_an_error_frame_and_stores_nothing(django_user_model, settings):
    settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_USER_REQUESTS_PER_MINUTE = "inprocess", 1
    user = await sync_to_async(django_user_model.objects.create_user)("chat-limited", password="pw-limited-1")
    conversation = await sync_to_async(Conversation.objects.create)(owner=user)
    ws = WebsocketCommunicator(as_user(user), f"/ws/chat/{conversation.pk}")
    assert (await ws.connect())[0]
    first = await talk(ws, {"type": "send", "content": "What is a list?", "params": PARAMS})
    refused = await talk(ws, {"type": "send", "content": "And a tuple?", "params": PARAMS})
    assert first[-1]["type"] == "done", "the control: a turn within the limit is answered"
    assert refused == [{"type": "error", "code": "rate_limited", "message": refused[0]["message"],
                        "retry_after": refused[0]["retry_after"]}]
    assert 1 <= refused[0]["retry_after"] <= 60 and "WORKBENCH_USER_REQUESTS_PER_MINUTE" in refused[0]["message"]
    stored = await sync_to_async(lambda: list(conversation.messages.values_list("role", "content")))()
    assert [role for role, _ in stored] == ["user", "assistant"] and stored[0][1] == "What is a list?"
    settings.WORKBENCH_USER_REQUESTS_PER_MINUTE = 0  # no limit: the same socket answers again
    again = await talk(ws, {"type": "send", "content": "And a tuple?", "params": PARAMS})
    assert again[-1]["type"] == "done"
    await ws.disconnect()
