"""Branches: editing any user message forks a new branch from there, the old one kept and reachable
(< n/m > on the edited message); the history the model is given follows the branch shown, through the
real socket and transport (the prompt ids the engine gets); switching is stored, the owner's only,
CSRF-checked and refused while a reply is generated. Search matches only what is shown. A page that
resumed a reply mid-way hears the error that ends it, after every delta before it."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.workbench.test_chat import as_user, frames_until, talk
from workbench.chat import versions
from workbench.chat.models import Conversation, Message, NotShown, ReplyUnderWay
from workbench.chat.search import search

# Conversation storage: runs on PostgreSQL too (tests/settings_postgres.py).
pytestmark = pytest.mark.postgres


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


def answer(chat: Conversation, turn: str, content: str | None, reply: str, message_id: int | None = None):
    history, claim = chat.take_turn(turn, content, message_id) or pytest.fail("nothing to answer")
    chat.add_reply(content=reply, finish_reason="stop")
    chat.release_reply(claim)
    return history


def contents(chat: Conversation) -> list[str]:
    return [m.content for m in chat.shown_messages()]


def three_exchanges(owner) -> Conversation:
    chat = Conversation.start(owner)
    for n in (1, 2, 3):
        answer(chat, "send", f"question {n}", f"answer {n}")
    return chat


@pytest.mark.django_db
def test_editing_a_middle_message_forks_a_branch_the_history_follows_and_the_old_one_stays(alice):
    chat = three_exchanges(alice)
    q2 = chat.messages.get(content="question 2")
    history = answer(chat, "edit", "question 2, reworded", "answer 2b", q2.pk)
    assert [m["content"] for m in history] == ["question 1", "answer 1", "question 2, reworded"]
    assert contents(chat) == ["question 1", "answer 1", "question 2, reworded", "answer 2b"]
    assert chat.messages.count() == 8, "the old branch is kept whole"

    shown = versions.shown(chat)
    edited = shown[2]
    assert (edited.version, edited.versions, edited.previous_id) == (2, (q2.pk, edited.message.pk), q2.pk)
    assert len(shown[3].versions) == 1, "the new branch's reply is its only version"
    # The next message continues the new branch.
    assert [m["content"] for m in answer(chat, "send", "question 3b", "answer 3b")][-3:] == [
        "question 2, reworded", "answer 2b", "question 3b"]

    versions.show(chat, q2.pk)  # back to the old words: the old branch as it was, below them too
    assert contents(chat) == ["question 1", "answer 1", "question 2", "answer 2", "question 3", "answer 3"]
    assert chat.history()[-1] == {"role": "assistant", "content": "answer 3"}
    assert versions.shown(chat)[2].as_frame() == {"version": 1, "count": 2, "previous": None,
                                                  "next": edited.message.pk}
    # Showing a message deep in a hidden branch brings its whole branch up.
    versions.show(chat, chat.messages.get(content="answer 3b").pk)
    assert contents(chat)[2:] == ["question 2, reworded", "answer 2b", "question 3b", "answer 3b"]

    # The first message forks too; a regenerate on a branch keeps versions of that branch's reply.
    first = chat.messages.get(content="question 1")
    answer(chat, "edit", "question 1b", "answer 1b", first.pk)
    assert contents(chat) == ["question 1b", "answer 1b"]
    answer(chat, "regenerate", None, "answer 1c")
    assert contents(chat) == ["question 1b", "answer 1c"]
    assert [len(s.versions) for s in versions.shown(chat)] == [2, 2]
    versions.show(chat, first.pk)
    assert contents(chat)[:4] == ["question 1", "answer 1", "question 2, reworded", "answer 2b"]


@pytest.mark.django_db
def test_an_edit_of_a_message_not_shown_or_not_the_users_is_refused_and_changes_nothing(alice):
    chat = three_exchanges(alice)
    q2 = chat.messages.get(content="question 2")
    answer(chat, "edit", "question 2b", "answer 2b", q2.pk)
    before = chat.messages.count()
    for message_id in (q2.pk, chat.messages.get(content="answer 1").pk, 10 ** 9):  # hidden, a reply, none
        with pytest.raises(NotShown):
            chat.take_turn("edit", "again", message_id)
    assert chat.messages.count() == before and Conversation.objects.get(pk=chat.pk).replying_since is None


@pytest.mark.django_db
def test_switching_branches_is_the_owners_only_csrf_checked_and_refused_while_a_reply_is_generated(
        alice, django_user_model):
    chat = three_exchanges(alice)
    q2 = chat.messages.get(content="question 2")
    answer(chat, "edit", "question 2b", "answer 2b", q2.pk)
    url = f"/c/{chat.pk}/versions/{q2.pk}"

    bob = Client()
    bob.force_login(django_user_model.objects.create_user("bob", password="pw-bob-123"))
    assert bob.post(url).status_code == 404
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(url).status_code == 403
    owner = Client()
    owner.force_login(alice)
    _, claim = chat.take_turn("send", "while answering") or pytest.fail("nothing to answer")
    busy = owner.post(url)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"
    with pytest.raises(ReplyUnderWay):
        chat.take_turn("edit", "at once", q2.pk)
    chat.release_reply(claim)
    assert "question 2b" in contents(chat), "nothing switched meanwhile"

    assert owner.post(url).status_code == 302
    page = owner.get(f"/c/{chat.pk}").content.decode()
    assert ">question 2</div>" in page and ">question 2b</div>" not in page, "stored: a reload shows it"
    assert 'aria-label="Versions of this message"' in page and ">1/2<" in page


@pytest.mark.django_db
def test_search_matches_only_the_messages_shown(alice):
    chat = three_exchanges(alice)
    answer(chat, "regenerate", None, "answer 3, second version")
    answer(chat, "edit", "question 2, reworded", "answer 2b", chat.messages.get(content="question 2").pk)
    assert chat.messages.filter(content="answer 1").exists()  # liveness: the words searched for are stored
    found = search(alice, "answer 1")
    assert [(f.conversation.pk, f.snippet) for f in found] == [(chat.pk, "answer 1")]
    for hidden in ("question 3", "answer 3, second"):  # on the old branch only
        assert search(alice, hidden) == [], hidden
    assert search(alice, "question 2") and search(alice, "question 2")[0].snippet == "question 2, reworded"
    versions.show(chat, chat.messages.get(content="question 2").pk)
    assert [f.snippet for f in search(alice, "second version")] == ["answer 3, second version"]


@pytest.mark.django_db
def test_messages_stored_before_branches_are_linked_as_they_read(alice):
    """Migration 0005: a conversation written as a flat list (nothing names what it follows, but a
    regenerated reply its question) reads the same after it, and continues from its last message."""
    import importlib

    from django.apps import apps

    link = importlib.import_module("workbench.chat.migrations.0005_branches").link
    chat = Conversation.start(alice)
    q1 = Message.objects.create(conversation=chat, role="user", content="one")
    Message.objects.create(conversation=chat, role="assistant", content="1a", reply_to=q1, shown=False)
    Message.objects.create(conversation=chat, role="assistant", content="1b", reply_to=q1)
    Message.objects.create(conversation=chat, role="user", content="two")
    Message.objects.create(conversation=chat, role="assistant", content="2a")
    assert contents(chat) != ["one", "1b", "two", "2a"], "liveness: unlinked, it reads otherwise"
    link(apps, None)
    assert contents(chat) == ["one", "1b", "two", "2a"]
    assert [len(s.versions) for s in versions.shown(chat)] == [1, 2, 1, 1]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_engine_is_given_the_branch_shown(alice, monkeypatch):
    """Through the socket and the real in-process transport: an edit of a middle message sends the
    engine the new branch's prompt; after switching back (the page's POST), a regenerate sends it the
    old branch's, token for token as the template renders each."""
    from asgiref.sync import sync_to_async

    from workbench.serving import bridge

    chat = await sync_to_async(three_exchanges)(alice)
    transport = await bridge.transport_from_loop()
    submitted: list[list[int]] = []
    real_submit = transport.submit

    def spy(request_id, prompt, params, **kwargs):
        submitted.append(list(prompt))
        return real_submit(request_id, prompt, params, **kwargs)

    monkeypatch.setattr(transport, "submit", spy)
    q2 = await sync_to_async(lambda: chat.messages.get(content="question 2").pk)()
    ws = WebsocketCommunicator(as_user(alice), f"/ws/chat/{chat.pk}")
    assert (await ws.connect())[0]
    params = {"temperature": 0, "max_tokens": 2, "ignore_eos": True}
    frames = await talk(ws, {"type": "edit", "message_id": q2, "content": "question 2, reworded", "params": params})
    assert frames[-1]["type"] == "done", frames[-1]
    started = frames[0]
    assert started["type"] == "started" and started["asked"]["versions"]["count"] == 2
    assert started["asked"]["versions"]["previous"] == q2 and started["asked"]["message_id"] != q2

    def turns(*texts: str) -> list[dict[str, str]]:
        return [{"role": "user" if n % 2 == 0 else "assistant", "content": t} for n, t in enumerate(texts)]

    encode = transport.tokenizer.encode_chat
    assert submitted == [encode(turns("question 1", "answer 1", "question 2, reworded"))]

    client = Client()
    await sync_to_async(client.force_login)(alice)
    assert (await sync_to_async(client.post)(f"/c/{chat.pk}/versions/{q2}")).status_code == 302
    assert (await talk(ws, {"type": "regenerate", "params": params}))[-1]["type"] == "done"
    assert submitted[1] == encode(turns("question 1", "answer 1", "question 2", "answer 2", "question 3"))
    refused = await talk(ws, {"type": "edit", "message_id": started["asked"]["message_id"], "content": "x",
                              "params": params})
    assert refused[-1]["code"] == "invalid_request" and len(submitted) == 2, "a hidden message is not edited"
    await ws.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_page_that_resumed_mid_reply_hears_the_error_that_ends_it_after_its_deltas(alice):
    """The reply's conversation is deleted while it streams: the socket that asked and one that
    resumed mid-way both get every delta, then the error, then are closed; no delta after the error."""
    from asgiref.sync import sync_to_async

    chat = await sync_to_async(Conversation.start)(alice)
    path = f"/ws/chat/{chat.pk}"
    asking, resumed = WebsocketCommunicator(as_user(alice), path), WebsocketCommunicator(as_user(alice), path)
    await asking.connect()
    await resumed.connect()
    await asking.send_to(text_data=json.dumps({"type": "send", "content": "x",
                                               "params": {"max_tokens": 500, "ignore_eos": True, "temperature": 0}}))
    asked = await frames_until(asking, ("delta",))
    await resumed.send_to(text_data=json.dumps({"type": "resume", "from_offset": 0}))
    caught_up = await frames_until(resumed, ("delta",))
    await sync_to_async(Conversation.objects.filter(pk=chat.pk).delete)()
    await asking.send_to(text_data=json.dumps({"type": "stop"}))
    for ws, before in ((asking, asked), (resumed, caught_up)):
        frames = before + await frames_until(ws, ("error",))
        assert frames[-1]["code"] == "conversation_gone", frames[-1]
        assert any(f["type"] == "delta" for f in frames), "liveness: it was following the reply"
        offsets = [f["index"] for f in frames if f["type"] == "delta"]
        assert offsets == sorted(set(offsets)), "each delta once, in order"
        assert (await ws.receive_output(timeout=10))["type"] == "websocket.close", "nothing after the error"
