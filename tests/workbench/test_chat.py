"""The chat app: pages are private to their owner, and the chat socket stores what it streams."""

from __future__ import annotations

import json

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from workbench.chat.models import Conversation, Message
from workbench.chat.routing import websocket_urlpatterns

# Conversation storage: runs on PostgreSQL too (tests/settings_postgres.py).
pytestmark = pytest.mark.postgres


def as_user(user, patterns=websocket_urlpatterns):
    """A socket application that sees `user` as signed in, for `patterns` (the chat's by default)."""
    router = URLRouter(patterns)

    async def app(scope, receive, send):  # what AuthMiddlewareStack does with a session, for one user
        return await router({**scope, "user": user}, receive, send)

    return app


@pytest.fixture
def users(django_user_model):
    return (django_user_model.objects.create_user("alice", password="pw-alice-123"),
            django_user_model.objects.create_user("bob", password="pw-bob-123"))


@pytest.mark.django_db
def test_a_conversation_page_is_only_its_owners(client, users):
    alice, bob = users
    conversation = Conversation.objects.create(owner=alice, title="Alice's secret")
    assert client.get(f"/c/{conversation.pk}").status_code == 302  # anonymous: to the login page
    client.force_login(bob)
    assert client.get(f"/c/{conversation.pk}").status_code == 404
    assert "Alice's secret" not in client.get("/").content.decode()
    client.force_login(alice)
    page = client.get(f"/c/{conversation.pk}")
    assert page.status_code == 200 and "Alice&#x27;s secret" in page.content.decode()


@pytest.mark.django_db
def test_signup_then_login_and_a_new_conversation_opens(client):
    response = client.post("/signup", {"username": "carol", "password1": "a-long-pass-9!", "password2": "a-long-pass-9!"})
    assert response.status_code == 302 and response["Location"].startswith("/login?")
    page = client.get(response["Location"])
    assert 'value="carol"' in page.content.decode(), "the login page has the name filled in"
    assert client.post("/login", {"username": "carol", "password": "a-long-pass-9!"}).status_code == 302
    response = client.post("/")
    conversation = Conversation.objects.get(owner__username="carol")
    assert response["Location"] == f"/c/{conversation.pk}"


@pytest.mark.django_db
def test_api_tokens_are_created_once_and_revoked(client, users):
    from workbench.api.models import ApiToken

    client.force_login(users[0])
    page = client.post("/tokens", {"name": "laptop"}).content.decode()
    token = ApiToken.objects.get(user=users[0])
    plaintext = page.split('id="new-token">')[1].split("<")[0]
    assert ApiToken.user_for(plaintext) == users[0] and token.digest not in page
    client.post(f"/tokens/{token.pk}/revoke")
    assert ApiToken.user_for(plaintext) is None
    first = ApiToken.objects.get(pk=token.pk).revoked_at
    client.post(f"/tokens/{token.pk}/revoke")
    assert ApiToken.objects.get(pk=token.pk).revoked_at == first, "revoking again keeps when it was revoked"
    client.force_login(users[1])
    assert client.post(f"/tokens/{token.pk}/revoke").status_code == 404


async def talk(communicator, frame):
    await communicator.send_to(text_data=json.dumps(frame))
    frames = []
    while True:
        frames.append(json.loads(await communicator.receive_from(timeout=30)))
        if frames[-1]["type"] in ("done", "error"):
            return frames


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_chat_socket_streams_stores_regenerates_and_refuses_strangers(users):
    from asgiref.sync import sync_to_async

    alice, bob = users
    conversation = await sync_to_async(Conversation.objects.create)(owner=alice)
    path = f"/ws/chat/{conversation.pk}"
    for stranger in (bob, AnonymousUser()):
        connected, code = await WebsocketCommunicator(as_user(stranger), path).connect()
        assert not connected and code == 4404

    ws = WebsocketCommunicator(as_user(alice), path)
    assert (await ws.connect())[0]
    params = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
    frames = await talk(ws, {"type": "send", "content": "What is a list?", "params": params})
    streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert frames[0]["type"] == "started" and frames[-1]["type"] == "done" and streamed
    stored = await sync_to_async(lambda: list(conversation.messages.values_list("role", "content", "finish_reason")))()
    assert stored == [("user", "What is a list?", ""), ("assistant", streamed, "length")]

    again = await talk(ws, {"type": "regenerate", "params": params})
    assert "".join(f["text"] for f in again if f["type"] == "delta") == streamed  # greedy: the same reply
    # The same prompt again: the engine found its prefix cached, and the stored reply keeps how much.
    cached = await sync_to_async(lambda: dict(conversation.messages.filter(role="assistant")
                                              .values_list("pk", "cached_tokens")))()
    assert cached == {frames[-1]["message_id"]: frames[-1]["usage"]["cached_tokens"],
                      again[-1]["message_id"]: again[-1]["usage"]["cached_tokens"]}
    if settings.WORKBENCH_TRANSPORT == "inprocess":  # over Celery the regenerate may reach the other worker's cache
        assert again[-1]["usage"]["cached_tokens"] > 0, "liveness: the regenerated prompt hit the prefix cache"
    assert await sync_to_async(conversation.messages.count)() == 3, "the earlier reply kept as a version"
    assert await sync_to_async(lambda: conversation.shown_messages().count())() == 2
    assert again[-1]["versions"] == {"version": 2, "count": 2, "previous": frames[-1]["message_id"], "next": None}

    # The page may leave max_tokens out: the reply may then run to the end of the model's context.
    unbounded = await talk(ws, {"type": "regenerate", "params": {"temperature": 0, "ignore_eos": True}})
    done = unbounded[-1]
    assert done["finish_reason"] == "length"
    assert done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"] == 512  # the demo model's length

    bad = await talk(ws, {"type": "send", "content": "   ", "params": params})
    assert bad[-1]["type"] == "error" and bad[-1]["code"] == "invalid_request"
    await ws.disconnect()
    title = await sync_to_async(lambda: Conversation.objects.get(pk=conversation.pk).title)()
    assert title == "What is a list?"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_stop_keeps_the_partial_reply_as_canceled(users):
    from asgiref.sync import sync_to_async

    conversation = await sync_to_async(Conversation.objects.create)(owner=users[0])
    ws = WebsocketCommunicator(as_user(users[0]), f"/ws/chat/{conversation.pk}")
    await ws.connect()
    await ws.send_to(text_data=json.dumps({"type": "send", "content": "x",
                                           "params": {"max_tokens": 400, "ignore_eos": True, "temperature": 0}}))
    assert json.loads(await ws.receive_from(timeout=10))["type"] == "started"
    assert json.loads(await ws.receive_from(timeout=10))["type"] == "delta"
    await ws.send_to(text_data=json.dumps({"type": "stop"}))
    frames = []
    while not frames or frames[-1]["type"] != "done":
        frames.append(json.loads(await ws.receive_from(timeout=10)))
    assert frames[-1]["finish_reason"] == "canceled" and frames[-1]["usage"]["completion_tokens"] < 400
    reply = await sync_to_async(lambda: Message.objects.get(conversation=conversation, role="assistant"))()
    assert reply.finish_reason == "canceled" and reply.completion_tokens == frames[-1]["usage"]["completion_tokens"]
    await ws.disconnect()


async def frames_until(ws, kinds: tuple[str, ...], timeout: float = 30) -> list[dict]:
    frames = []
    while not frames or frames[-1]["type"] not in kinds:
        frames.append(json.loads(await ws.receive_from(timeout=timeout)))
    return frames


LONG_REPLY = {"max_tokens": 500, "ignore_eos": True, "temperature": 0}


async def long_reply_asked(user) -> tuple[Conversation, WebsocketCommunicator]:
    """A new conversation of `user`, its socket open, and a long greedy reply just asked for."""
    from asgiref.sync import sync_to_async

    conversation = await sync_to_async(Conversation.objects.create)(owner=user)
    ws = WebsocketCommunicator(as_user(user), f"/ws/chat/{conversation.pk}")
    await ws.connect()
    await ws.send_to(text_data=json.dumps({"type": "send", "content": "x", "params": LONG_REPLY}))
    return conversation, ws


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_a_stop_sent_right_after_the_message_stops_it(users):
    """The stop comes before the reply has an engine request (the first request after a restart waits
    for the transport to start): it must still stop it, not let it run to max_tokens."""
    _, ws = await long_reply_asked(users[0])
    await ws.send_to(text_data=json.dumps({"type": "stop"}))
    done = (await frames_until(ws, ("done",)))[-1]
    assert done["finish_reason"] == "canceled" and (done["usage"] or {}).get("completion_tokens", 0) < 500
    await ws.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_a_conversation_deleted_while_it_is_answered_ends_the_reply_and_the_socket(users):
    from asgiref.sync import sync_to_async

    conversation, ws = await long_reply_asked(users[0])
    await frames_until(ws, ("delta",))
    await sync_to_async(Conversation.objects.filter(pk=conversation.pk).delete)()
    await ws.send_to(text_data=json.dumps({"type": "stop"}))
    frames = await frames_until(ws, ("error",))
    assert frames[-1]["code"] == "conversation_gone"
    assert (await ws.receive_output(timeout=10))["type"] == "websocket.close"
    assert await sync_to_async(Message.objects.count)() == 0


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_a_conversation_longer_than_the_model_is_answered_from_its_newest_turns(users):
    """The demo model reads 512 tokens: an old long message gives way, and a failed reply stored for the
    page is not part of what the model continues. A last message too long alone is a clear error."""
    from asgiref.sync import sync_to_async

    conversation = await sync_to_async(Conversation.objects.create)(owner=users[0])

    def seed() -> None:
        asked = Message.objects.create(conversation=conversation, role="user", content="tell me " * 400)
        Message.objects.create(conversation=conversation, role="assistant", content="", finish_reason="error",
                               error="prompt too long", reply_to=asked)

    await sync_to_async(seed)()
    ws = WebsocketCommunicator(as_user(users[0]), f"/ws/chat/{conversation.pk}")
    await ws.connect()
    params = {"max_tokens": 8, "ignore_eos": True, "temperature": 0}
    frames = await talk(ws, {"type": "send", "content": "What is a list?", "params": params})
    assert frames[-1]["type"] == "done" and frames[-1]["finish_reason"] == "length", frames[-1]
    # What the model saw: the newest turn alone, exactly as a fresh conversation would send it.
    fresh = await sync_to_async(Conversation.objects.create)(owner=users[0])
    ws_fresh = WebsocketCommunicator(as_user(users[0]), f"/ws/chat/{fresh.pk}")
    await ws_fresh.connect()
    alone = await talk(ws_fresh, {"type": "send", "content": "What is a list?", "params": params})
    assert "".join(f["text"] for f in frames if f["type"] == "delta") == \
        "".join(f["text"] for f in alone if f["type"] == "delta")
    too_long = await talk(ws, {"type": "send", "content": "tell me " * 1000, "params": params})
    assert too_long[-1]["type"] == "error" and "shorten it" in too_long[-1]["message"]
    await ws.disconnect()
    await ws_fresh.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_two_tabs_on_one_conversation_take_turns(users):
    """One reply at a time per conversation, whichever socket asks: a second tab is told it is busy and
    stores nothing, and once the first reply ends it is answered; the history stays question, answer."""
    from asgiref.sync import sync_to_async

    conversation = await sync_to_async(Conversation.objects.create)(owner=users[0])
    path = f"/ws/chat/{conversation.pk}"
    first, second = WebsocketCommunicator(as_user(users[0]), path), WebsocketCommunicator(as_user(users[0]), path)
    await first.connect()
    await second.connect()
    params = {"max_tokens": None, "ignore_eos": True, "temperature": 0}  # to the model's length: runs until stopped
    await first.send_to(text_data=json.dumps({"type": "send", "content": "from the first tab", "params": params}))
    await frames_until(first, ("delta",))
    for frame in ({"type": "send", "content": "from the second tab", "params": params},
                  {"type": "regenerate", "params": params}, {"type": "edit", "content": "edited", "params": params}):
        refused = await talk(second, frame)
        assert refused[-1]["type"] == "error" and refused[-1]["code"] == "busy", refused[-1]
    await first.send_to(text_data=json.dumps({"type": "stop"}))
    await frames_until(first, ("done",))
    answered = await talk(second, {"type": "send", "content": "from the second tab", "params": {**params, "max_tokens": 4}})
    assert answered[-1]["type"] == "done" and answered[-1]["finish_reason"] == "length"
    stored = await sync_to_async(lambda: list(conversation.messages.order_by("created_at", "id")
                                              .values_list("role", "content")))()
    assert [(role, content if role == "user" else "") for role, content in stored] == [
        ("user", "from the first tab"), ("assistant", ""), ("user", "from the second tab"), ("assistant", "")]
    await first.disconnect()
    await second.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_a_socket_opened_before_logging_out_is_closed_by_the_logout(users):
    """Through the real session middleware: the socket keeps the session it was opened with, so once
    the user logs out (in any tab) it is told `signed_out` and closed with SIGNED_OUT, without a frame
    of its own; nothing more is stored."""
    from asgiref.sync import sync_to_async
    from django.test import Client

    from workbench.asgi import application
    from workbench.protocol.socket_access import SIGNED_OUT_CLOSE

    conversation = await sync_to_async(Conversation.objects.create)(owner=users[0])
    browser = Client()
    await sync_to_async(browser.force_login)(users[0])
    cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()
    ws = WebsocketCommunicator(application, f"/ws/chat/{conversation.pk}",
                               headers=[(b"cookie", cookie), (b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1")])
    assert (await ws.connect())[0]
    params = {"max_tokens": 4, "ignore_eos": True, "temperature": 0}
    assert (await talk(ws, {"type": "send", "content": "first", "params": params}))[-1]["type"] == "done"
    await sync_to_async(browser.post)("/logout")
    refused = json.loads(await ws.receive_from(timeout=10))
    assert refused["type"] == "error" and refused["code"] == "signed_out"
    assert await ws.receive_output(timeout=10) == {"type": "websocket.close", "code": SIGNED_OUT_CLOSE}
    contents = await sync_to_async(lambda: list(conversation.messages.filter(role="user").values_list("content", flat=True)))()
    assert contents == ["first"]


def test_fitting_keeps_the_most_turns_that_fit_starting_at_a_user_message():
    """Against the plain search it replaces: every suffix from a user message, longest first."""
    from engine.loading.model_files import resolve_model_path
    from engine.loading.tokenizer import Tokenizer
    from workbench.chat.fitting import fitted_prompt, model_length

    tokenizer = Tokenizer.from_dir(resolve_model_path("demo"))
    limit = model_length("demo") - 1
    for turns_count, words in [(3, 10), (9, 30), (20, 25), (31, 12)]:
        history = [{"role": "system", "content": "Be brief."}]
        for n in range(turns_count):
            history.append({"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "word " * words})
        system, turns = history[:1], history[1:]
        fitting = [tokenizer.encode_chat(system + turns[k:]) for k in range(len(turns)) if turns[k]["role"] == "user"]
        expected = next(ids for ids in fitting if len(ids) <= limit)
        assert fitted_prompt(tokenizer, history) == expected
