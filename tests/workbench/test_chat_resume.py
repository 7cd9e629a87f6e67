"""A reply outlives the socket that asked for it (workbench/chat/live.py): a page that comes back follows
it with `resume`. Two paths of that, each through the real chat socket and the in-process engine: a
`stop` sent from the resumed socket stops the reply in the engine (stored as canceled), and a reply that
finished while no socket followed it comes back as one `done` frame with the stored reply's content.
And a turn naming a model not served is refused by name (the model selector's socket side)."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from tests.workbench.test_chat import LONG_REPLY, as_user, frames_until, talk
from workbench.chat import live
from workbench.chat.models import Conversation, Message
from workbench.serving import bridge


@pytest.fixture
def dana(django_user_model):
    return django_user_model.objects.create_user("dana", password="pw-dana-123")


async def asked_then_dropped(user, params: dict) -> tuple[Conversation, list[dict]]:
    """A new conversation of `user` whose socket asks for a reply and closes once the reply has started
    (its first delta in); the frames it got."""
    chat = await sync_to_async(Conversation.start)(user)
    asking = WebsocketCommunicator(as_user(user), f"/ws/chat/{chat.pk}")
    await asking.connect()
    await asking.send_to(text_data=json.dumps({"type": "send", "content": "Tell me about lists", "params": params}))
    frames = await frames_until(asking, ("delta", "done", "error"))
    await asking.disconnect()
    return chat, frames


async def resumed(user, chat: Conversation, from_offset: int) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(as_user(user), f"/ws/chat/{chat.pk}")
    await ws.connect()
    await ws.send_to(text_data=json.dumps({"type": "resume", "from_offset": from_offset}))
    return ws


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_stop_from_a_resumed_socket_stops_the_reply_in_the_engine(dana):
    chat, asked = await asked_then_dropped(dana, LONG_REPLY)
    assert asked[-1]["type"] == "delta", asked
    ws = await resumed(dana, chat, 0)
    caught_up = await frames_until(ws, ("delta",))
    assert caught_up[-1]["index"] == 0, "liveness: it follows the reply from the offset asked"
    await ws.send_to(text_data=json.dumps({"type": "stop"}))
    frames = caught_up + await frames_until(ws, ("done", "error"))
    done = frames[-1]
    assert done["type"] == "done" and done["finish_reason"] == "canceled", done
    offsets = [f["index"] for f in frames if f["type"] == "delta"]
    assert offsets == sorted(set(offsets)) and offsets[0] == 0, "each token once, in order, from the first"
    stored = await sync_to_async(Message.objects.get)(pk=done["message_id"])
    assert stored.finish_reason == "canceled" and stored.completion_tokens < LONG_REPLY["max_tokens"]
    assert not [r for r in bridge.transport().running_request_ids() if r.startswith(f"chat-{chat.pk}-")]
    await ws.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_reply_that_finished_while_nobody_followed_comes_back_whole_as_stored(dana):
    chat, asked = await asked_then_dropped(dana, {"max_tokens": 12, "ignore_eos": True, "temperature": 0})
    for _ in range(300):  # it runs on, unfollowed, to its end (stored, and off the live registry)
        if live.of(chat.pk) is None:
            break
        await asyncio.sleep(0.1)
    stored = await sync_to_async(lambda: chat.messages.filter(role="assistant").get())()
    assert stored.completion_tokens == 12 and stored.content, "liveness: the reply was written whole"
    ws = await resumed(dana, chat, 3)  # the page had three tokens when its socket dropped
    done = json.loads(await ws.receive_from(timeout=30))
    assert done["type"] == "done" and done["content"] == stored.content, done
    assert (done["message_id"], done["finish_reason"], done["usage"]["completion_tokens"]) == \
        (stored.pk, "length", 12)
    assert await ws.receive_nothing(timeout=0.5), "one frame: the stored reply replaces what the page had"
    await ws.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_turn_naming_a_model_not_served_is_refused_by_name_and_stores_nothing(dana):
    """The page's selector offers only what is served; a frame naming another (a stale page, a hand-made
    frame) gets model_not_found, and the same socket then answers with the model it names rightly."""
    from django.conf import settings

    chat = await sync_to_async(Conversation.start)(dana)
    ws = WebsocketCommunicator(as_user(dana), f"/ws/chat/{chat.pk}")
    await ws.connect()
    params = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
    refused = await talk(ws, {"type": "send", "content": "Hi", "params": params, "model": "gpt-4o"})
    assert refused[-1]["code"] == "model_not_found" and repr(settings.WORKBENCH_MODEL) in refused[-1]["message"]
    assert not await sync_to_async(chat.messages.exists)(), "nothing stored"
    answered = await talk(ws, {"type": "send", "content": "Hi", "params": params, "model": settings.WORKBENCH_MODEL})
    assert answered[-1]["type"] == "done" and answered[-1]["model"] == settings.WORKBENCH_MODEL
    stored = await sync_to_async(lambda: chat.messages.get(role="assistant"))()
    assert stored.model == settings.WORKBENCH_MODEL
    await ws.disconnect()
