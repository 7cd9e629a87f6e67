"""Managing conversations through the pages' views: rename, delete, search, export, settings. Every
path is the owner's only (anyone else gets 404 and changes nothing), the changes are CSRF-checked,
bad input is refused naming the field, and the title comes from the first exchange once it is answered."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from workbench.chat.models import ChatDefaults, Conversation, Message
from workbench.chat.titles import DEFAULT_TITLE, MAX_TITLE_CHARS, title_from

# Conversation storage: runs on PostgreSQL too (tests/settings_postgres.py).
pytestmark = pytest.mark.postgres


@pytest.fixture
def owned(django_user_model):
    """Alice's conversation with one exchange and a system prompt, and Bob, who is signed in."""
    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    conversation = Conversation.objects.create(owner=alice, title="Alice's plans", system_prompt="Be terse.",
                                               sampling={"temperature": 0.2})
    asked = Message.objects.create(conversation=conversation, role="user", content="Where is the hidden key?")
    Message.objects.create(conversation=conversation, role="assistant", content="Under the blue stone.",
                           finish_reason="stop", prompt_tokens=12, completion_tokens=5, cached_tokens=8,
                           reply_to=asked)
    return alice, bob, conversation


def settings_body(**sampling) -> str:
    return json.dumps({"system_prompt": "Answer in French.", "sampling": sampling})


@pytest.mark.django_db
def test_every_conversation_path_is_the_owners_only(client, owned):
    alice, bob, conversation = owned
    base = f"/c/{conversation.pk}"
    client.force_login(bob)
    for method, path, data in [("get", base, None), ("post", f"{base}/rename", {"title": "Bob's now"}),
                               ("post", f"{base}/delete", None), ("get", f"{base}/export.md", None),
                               ("get", f"{base}/export.json", None)]:
        response = getattr(client, method)(path, data)
        assert response.status_code == 404, (path, response.status_code)
        assert "hidden key" not in response.content.decode() and "blue stone" not in response.content.decode()
    response = client.post(f"{base}/settings", settings_body(temperature=1.5), content_type="application/json")
    assert response.status_code == 404
    found = client.get("/", {"q": "hidden key"}).content.decode()
    assert "Alice" not in found and "0 found" in found
    conversation.refresh_from_db()
    assert (conversation.title, conversation.system_prompt, conversation.sampling) == \
        ("Alice's plans", "Be terse.", {"temperature": 0.2}), "nothing changed"

    anonymous = Client()
    assert anonymous.get(f"{base}/export.json").status_code == 302  # to the login page
    assert anonymous.post(f"{base}/delete").status_code == 302
    assert Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.django_db
def test_changes_need_the_csrf_token(owned):
    alice, _, conversation = owned
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    for path, data in [(f"/c/{conversation.pk}/rename", {"title": "x"}), (f"/c/{conversation.pk}/delete", {})]:
        assert browser.post(path, data).status_code == 403
    response = browser.post(f"/c/{conversation.pk}/settings", settings_body(), content_type="application/json")
    assert response.status_code == 403
    assert Conversation.objects.get(pk=conversation.pk).title == "Alice's plans"


@pytest.mark.django_db
def test_the_owner_renames_searches_exports_and_deletes(client, owned):
    alice, _, conversation = owned
    client.force_login(alice)
    base = f"/c/{conversation.pk}"
    refused = client.post(f"{base}/rename", {"title": "   "})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "title"
    assert client.post(f"{base}/rename", {"title": "  Treasure\n hunt "}).status_code == 302
    assert Conversation.objects.get(pk=conversation.pk).title == "Treasure hunt"

    other = Conversation.objects.create(owner=alice, title="Groceries")
    by_text = client.get("/", {"q": "BLUE stone"}).content.decode()  # message text, any case
    assert "Treasure hunt" in by_text and "Groceries" not in by_text and "Under the blue stone." in by_text
    by_title = client.get("/", {"q": "grocer"}).content.decode()
    assert "Groceries" in by_title and "Treasure hunt" not in by_title

    markdown = client.get(f"{base}/export.md")
    assert markdown["Content-Disposition"] == f'attachment; filename="treasure-hunt-{conversation.pk}.md"'
    assert markdown.content.decode() == ("# Treasure hunt\n\n## System\n\nBe terse.\n\n## User\n\n"
                                         "Where is the hidden key?\n\n## Assistant\n\nUnder the blue stone.\n")
    exported = client.get(f"{base}/export.json")
    assert exported["Content-Type"] == "application/json" and "attachment" in exported["Content-Disposition"]
    data = exported.json()
    assert (data["title"], data["system_prompt"], data["sampling"]) == ("Treasure hunt", "Be terse.", {"temperature": 0.2})
    assert [(m["role"], m["content"]) for m in data["messages"]] == [
        ("user", "Where is the hidden key?"), ("assistant", "Under the blue stone.")]
    assert data["messages"][1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "cached_tokens": 8}
    assert "5 tokens · 8 of 12 prompt tokens cached" in client.get(base).content.decode(), "the reply's usage line"

    assert client.get(f"{base}/delete").status_code == 405  # a link cannot delete
    response = client.post(f"{base}/delete")
    assert response.status_code == 302 and response["Location"] == "/"
    assert not Conversation.objects.filter(pk=conversation.pk).exists() and not Message.objects.exists()
    assert Conversation.objects.filter(pk=other.pk).exists()


@pytest.mark.django_db
def test_settings_are_checked_saved_shown_and_a_default_for_new_conversations(client, owned):
    alice, _, conversation = owned
    client.force_login(alice)
    url = f"/c/{conversation.pk}/settings"
    for body, param in [(settings_body(temperature=-1), "temperature"), (settings_body(top_k="4"), "top_k"),
                        (settings_body(logprobs=2), "logprobs"), (json.dumps({"system_prompt": 4}), "system_prompt"),
                        (json.dumps({"colour": "red"}), "colour"), ("not json", "body")]:
        refused = client.post(url, body, content_type="application/json")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, (body, refused.content)
    assert Conversation.objects.get(pk=conversation.pk).sampling == {"temperature": 0.2}, "nothing saved"

    saved = client.post(url, settings_body(temperature=0, max_tokens=33, stop=["END", "##"], seed=7),
                        content_type="application/json")
    assert saved.status_code == 200
    page = client.get(f"/c/{conversation.pk}").content.decode()
    for shown in ['id="temperature" type="number" step="any" min="0" max="2" value="0"', 'value="33"',
                  'value="END, ##"', 'value="7"', ">Answer in French.</textarea>"]:
        assert shown in page, shown

    assert client.post("/settings/chat-defaults", settings_body(top_p=0.5),
                       content_type="application/json").status_code == 200
    assert ChatDefaults.objects.get(user=alice).sampling == {"top_p": 0.5}
    new = Conversation.objects.get(pk=client.post("/")["Location"].rsplit("/", 1)[1])
    assert (new.system_prompt, new.sampling) == ("Answer in French.", {"top_p": 0.5})
    assert 'value="0.5"' in client.get(f"/c/{new.pk}").content.decode()


def test_titles_are_the_first_words_of_the_first_message():
    assert title_from("  What is a list?  ") == "What is a list?"
    assert title_from("Explain this\n\nfor i in range(3): print(i)") == "Explain this"
    long = "Please explain in great detail how the paged key value cache of this engine decides what to evict"
    title = title_from(long)
    assert title.endswith("…") and len(title) <= MAX_TITLE_CHARS + 1 and long.startswith(title[:-1])
    assert " " not in title[-2:], "cut at a word boundary"
    assert title_from("x" * 500) == "x" * (MAX_TITLE_CHARS - 1) + "…"
    assert title_from(" \n ") == DEFAULT_TITLE


@pytest.mark.django_db
def test_the_title_is_set_when_the_first_reply_is_stored_and_a_rename_wins(django_user_model):
    user = django_user_model.objects.create_user("carol")
    conversation = Conversation.start(user)

    def exchange(chat: Conversation, question: str, reply: str, between=lambda: None) -> None:
        _, claim = chat.take_turn("send", question) or pytest.fail("nothing to answer")
        between()
        chat.add_reply(content=reply, finish_reason="stop")
        chat.release_reply(claim)

    def untitled_before_the_reply() -> None:
        assert Conversation.objects.get(pk=conversation.pk).title == DEFAULT_TITLE

    exchange(conversation, "How do I sort a dict by value?", "Use sorted().", untitled_before_the_reply)
    assert Conversation.objects.get(pk=conversation.pk).title == "How do I sort a dict by value?"
    exchange(conversation, "And by key?", "Also sorted().")
    assert Conversation.objects.get(pk=conversation.pk).title == "How do I sort a dict by value?", "the first exchange's"

    renamed = Conversation.start(user)
    # Renamed in another tab while the first reply was generated.
    exchange(renamed, "hello", "hi", lambda: Conversation.objects.filter(pk=renamed.pk).update(title="Mine"))
    assert Conversation.objects.get(pk=renamed.pk).title == "Mine"


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[n:n + len(part)] == part for n in range(len(ids) - len(part) + 1))


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_the_system_prompt_reaches_the_engine_through_the_chat_template(owned, monkeypatch):
    """Saved after the socket opened (as the page saves it), the system prompt leads the prompt the
    engine is given, as the template's system message; cleared, it is gone from the next one."""
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator

    from tests.workbench.test_chat import as_user, talk
    from workbench.serving import bridge

    alice, _, conversation = owned
    transport = await bridge.transport_from_loop()
    submitted: list[list[int]] = []
    real_submit = transport.submit

    def spy(request_id, prompt, params, **kwargs):
        submitted.append(list(prompt))
        return real_submit(request_id, prompt, params, **kwargs)

    monkeypatch.setattr(transport, "submit", spy)
    fresh = await sync_to_async(Conversation.start)(alice)
    ws = WebsocketCommunicator(as_user(alice), f"/ws/chat/{fresh.pk}")
    assert (await ws.connect())[0]
    system = "You are a pirate captain."
    await sync_to_async(Conversation.objects.filter(pk=fresh.pk).update)(system_prompt=system)
    params = {"temperature": 0, "max_tokens": 2, "ignore_eos": True}
    done = (await talk(ws, {"type": "send", "content": "Hi", "params": params}))[-1]
    assert done["type"] == "done", done

    tokenizer = transport.tokenizer
    expected = tokenizer.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
    assert submitted == [expected] and done["usage"]["prompt_tokens"] == len(expected)
    assert contains(submitted[0], tokenizer.encode(system, add_special_tokens=False))

    await sync_to_async(Conversation.objects.filter(pk=fresh.pk).update)(system_prompt="")
    assert (await talk(ws, {"type": "regenerate", "params": params}))[-1]["type"] == "done"
    assert submitted[1] == tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    await ws.disconnect()


@pytest.mark.django_db
def test_regenerate_keeps_versions_the_page_steps_through_and_the_model_follows(client, owned):
    from workbench.chat import versions

    alice, bob, other = owned
    chat = Conversation.start(alice)

    def answer(turn: str, content: str | None, reply: str) -> list[dict[str, str]]:
        history, claim = chat.take_turn(turn, content) or pytest.fail("nothing to answer")
        chat.add_reply(content=reply, finish_reason="stop")
        chat.release_reply(claim)
        return history

    answer("send", "Name a colour", "red")
    answer("regenerate", None, "green")
    answer("regenerate", None, "blue")
    last = versions.shown(chat)[-1]
    assert (last.message.content, last.version, len(last.versions)) == ("blue", 3, 3)
    red, green, blue = last.versions
    assert (last.previous_id, last.next_id) == (green, None)

    client.force_login(bob)
    assert client.post(f"/c/{chat.pk}/versions/{red}").status_code == 404
    client.force_login(alice)
    foreign = other.messages.get(role="assistant").pk  # Alice's, but another conversation's reply
    refused = client.post(f"/c/{chat.pk}/versions/{foreign}")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "message"
    assert client.post(f"/c/{chat.pk}/versions/{green}").status_code == 302
    page = client.get(f"/c/{chat.pk}").content.decode()
    assert ">green</div>" in page and ">blue</div>" not in page and ">2/3<" in page, "stored: a reload shows it"
    # The model continues from the version shown.
    assert answer("send", "Another", "yellow")[-3:] == [
        {"role": "user", "content": "Name a colour"}, {"role": "assistant", "content": "green"},
        {"role": "user", "content": "Another"}]

    _, claim = chat.take_turn("send", "While answering") or pytest.fail("nothing to answer")
    busy = client.post(f"/c/{chat.pk}/versions/{blue}")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"
    chat.release_reply(claim)
    assert [m.content for m in chat.shown_messages() if m.role == "assistant"] == ["green", "yellow"]
