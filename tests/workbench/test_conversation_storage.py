"""What the chat stores, as the deployment's database holds it: NUL in replies and in the JSON fields,
the JSON fields' round trip, two tabs writing one conversation at once, and a turn that fails midway.

Marked `postgres`: `make test` runs this module on SQLite with the rest, then again on PostgreSQL
(tests/settings_postgres.py), where text and jsonb refuse NUL and writers really run side by side.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from django.db import IntegrityError, connection, connections

from workbench.chat.models import Conversation, Message, ReplyUnderWay
from workbench.chat.stored_text import ESCAPE, NUL
from workbench.ops.models import FlagChange

pytestmark = pytest.mark.postgres


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


def asked(owner, question: str = "Say something odd.") -> Conversation:
    conversation = Conversation.start(owner)
    conversation.messages.create(role="user", content=question)
    return conversation


def raw_column(message: Message, column: str) -> str:
    """The column as the database holds it, past the field's reading."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM chat_message WHERE id = %s", [message.pk])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_a_reply_holding_nul_is_stored_escaped_and_read_back_whole(client, alice):
    conversation = asked(alice)
    plain = conversation.add_reply(content="plain text, é and 😀", finish_reason="stop")
    assert raw_column(plain, "content") == "plain text, é and 😀", "ordinary text is stored as it is"

    written = f"a{NUL}b {ESCAPE}0 {ESCAPE}{ESCAPE} {NUL}{NUL}end"
    reply = conversation.add_reply(content=written, error=f"the stop string {NUL!r} came", finish_reason="stop")
    assert NUL not in raw_column(reply, "content") and NUL not in raw_column(reply, "error")
    stored = Message.objects.get(pk=reply.pk)
    assert (stored.content, stored.error) == (written, f"the stop string {NUL!r} came")
    assert conversation.history()[-1] == {"role": "assistant", "content": written}
    assert list(Message.objects.filter(pk=reply.pk).values_list("content", flat=True)) == [written]

    client.force_login(alice)
    found = client.get("/", {"q": f"a{NUL}b"})
    assert found.status_code == 200 and "1 found" in found.content.decode(), "a NUL in a search is text too"
    exported = json.loads(client.get(f"/c/{conversation.pk}/export.json").content)
    assert exported["messages"][-1]["content"] == written


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/c/{id}/settings", "/settings/chat-defaults"])
def test_nul_in_the_saved_sampling_settings_is_refused_by_name_and_nothing_is_saved(client, alice, path):
    conversation = Conversation.start(alice)
    client.force_login(alice)
    url = path.format(id=conversation.pk)
    kept = client.post(url, json.dumps({"sampling": {"stop": ["END"]}}), content_type="application/json")
    assert kept.status_code == 200, kept.content  # liveness: the same body without NUL is saved
    refused = client.post(url, json.dumps({"sampling": {"stop": ["ok", f"a{NUL}"], "temperature": 0.5}}),
                          content_type="application/json")
    assert refused.status_code == 400
    assert refused.json()["error"] == {"code": "invalid_params", "param": "stop",
                                       "message": "stop: must not contain NUL (U+0000), which the database cannot store"}
    conversation.refresh_from_db()
    saved = conversation.sampling if "defaults" not in path else alice.chat_defaults.sampling
    assert saved == {"stop": ["END"]}


@pytest.mark.django_db
def test_an_api_token_named_with_nul_is_refused_and_none_is_made(client, alice):
    client.force_login(alice)
    refused = client.post("/tokens", {"name": f"laptop{NUL}"})
    assert refused.status_code == 400 and "name: must not contain NUL" in refused.content.decode()
    assert not alice.api_tokens.exists()
    assert client.post("/tokens", {"name": "laptop"}).status_code == 200
    assert list(alice.api_tokens.values_list("name", flat=True)) == ["laptop"]


# What jsonb changes when it stores a document: key order (by length, then bytes), spacing, and numbers
# are held as numeric. None of that may change what is read back. (One thing does: a float with a large
# positive exponent, 2.5e300, reads back as the integer it equals; docs/OPERATIONS.md, "Database".)
ODD_JSON = {"temperature": 0.1, "top_p": 1, "top_k": 40, "max_tokens": None, "seed": 2**63 - 1,
            "stop": ["\n\n", "é✓😀", "\\u0000 as six characters", "</s>", ""], "tiny": 1e-7, "neg": -0.5,
            "whole": 2.0, "zz": {"b": [True, False, None, {}], "a": []}, "ключ": "значение"}


@pytest.mark.django_db
def test_the_json_fields_round_trip_as_written(client, alice):
    conversation = Conversation.start(alice)
    conversation.sampling = ODD_JSON
    conversation.save()
    assert Conversation.objects.get(pk=conversation.pk).sampling == ODD_JSON
    assert json.dumps(Conversation.objects.get(pk=conversation.pk).sampling, sort_keys=True) == \
        json.dumps(ODD_JSON, sort_keys=True)

    change = FlagChange.objects.create(user=alice, name="ARC_GRAPH_DEVICE_LOOP", value=False,
                                       workers=["w-1", "w-2"], answers={"w-1": {"in_force": {"x": True}},
                                                                        "w-2": {"error": "gone é"}})
    stored = FlagChange.objects.get(pk=change.pk)
    assert (stored.value, stored.workers, stored.answers, stored.refused_by) == \
        (False, ["w-1", "w-2"], change.answers, ["w-2"])

    client.force_login(alice)
    page = {"temperature": 0.3, "top_p": 0.95, "top_k": 0, "max_tokens": 64, "stop": ["\n\n", "😀"], "seed": 7}
    saved = client.post("/settings/chat-defaults", json.dumps({"system_prompt": "Brief.", "sampling": page}),
                        content_type="application/json")
    assert saved.status_code == 200 and saved.json()["sampling"] == page
    assert Conversation.start(alice).sampling == page, "a new conversation starts from the stored defaults"


@pytest.fixture
def concurrent_writers():
    """Writers on connections of their own, side by side: PostgreSQL's run. SQLite's test database (in
    memory, shared cache) answers a second writer with "table is locked" at once instead of waiting."""
    if connection.vendor == "sqlite":
        pytest.skip("two writers at once need a database that lets them wait: the PostgreSQL run has them")


def side_by_side(workers: list[Callable[[], None]]) -> None:
    """Run each in a thread of its own (its own database connection), and re-raise the first failure."""
    failures: list[BaseException] = []

    def run(work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # reported to the test's thread below
            failures.append(exc)
        finally:
            connections.close_all()  # a connection left open keeps the test database from being dropped

    threads = [threading.Thread(target=run, args=(work,)) for work in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a writer hung"
    if failures:
        raise failures[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("concurrent_writers")
def test_tabs_claiming_one_conversation_at_the_same_moment_get_one_claim_between_them(alice):
    conversation = Conversation.start(alice)
    tabs, rounds = 4, 20
    start, done = threading.Barrier(tabs), threading.Barrier(tabs)
    claims: list[list[bool]] = [[] for _ in range(rounds)]

    def tab() -> None:
        mine = Conversation.objects.get(pk=conversation.pk)
        for n in range(rounds):
            start.wait()
            claim = mine.claim_reply()
            claims[n].append(claim is not None)
            done.wait()  # every tab has asked before the claim is let go
            if claim is not None:
                mine.release_reply(claim)

    side_by_side([tab] * tabs)
    assert [sum(asked) for asked in claims] == [1] * rounds, "each round: exactly one tab holds the claim"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("concurrent_writers")
def test_two_tabs_sending_at_once_lose_no_turn_and_keep_the_order(alice):
    conversation = Conversation.start(alice)
    turns = 8
    refused: list[str] = []

    def tab(name: str) -> Callable[[], None]:
        def send_all() -> None:
            mine = Conversation.objects.get(pk=conversation.pk)
            for n in range(turns):
                while True:
                    try:
                        taken = mine.take_turn("send", f"{name}-{n}")
                        break
                    except ReplyUnderWay:  # what the page is told: busy, try again
                        refused.append(name)
                        time.sleep(0.002)
                assert taken is not None
                history, claim = taken
                assert history[-1] == {"role": "user", "content": f"{name}-{n}"}, "answered what it asked"
                time.sleep(0.005)  # the reply streams; the other tab asks meanwhile
                mine.add_reply(content=f"answer to {name}-{n}", finish_reason="stop")
                mine.release_reply(claim)
        return send_all

    side_by_side([tab("left"), tab("right")])
    shown = list(Conversation.objects.get(pk=conversation.pk).shown_messages())
    assert len(shown) == 4 * turns, "every turn's question and answer is stored"
    for question, answer in zip(shown[::2], shown[1::2]):
        assert (question.role, answer.role) == ("user", "assistant")
        assert answer.content == f"answer to {question.content}" and answer.reply_to_id == question.pk
    assert all(later.reply_to_id == earlier.pk for earlier, later in zip(shown, shown[1:])), "one chain"
    for name in ("left", "right"):
        assert [m.content for m in shown if m.role == "user" and m.content.startswith(name)] == \
            [f"{name}-{n}" for n in range(turns)]
    assert refused, "the tabs really met: one was told the other's reply was under way"


@pytest.mark.django_db
def test_a_reply_that_fails_to_store_leaves_the_earlier_reply_shown(alice):
    conversation = asked(alice)
    first = conversation.add_reply(content="the first answer", finish_reason="stop")
    _, claim = conversation.take_turn("regenerate", None)
    with pytest.raises(IntegrityError):  # the database's own check (a count below zero) fails the write
        conversation.add_reply(content="half an answer", finish_reason="stop", prompt_tokens=-1)
    conversation.release_reply(claim)
    assert [(m.content, m.shown) for m in conversation.messages.filter(role="assistant")] == [("the first answer", True)]
    assert conversation.history()[-1]["content"] == "the first answer"

    second = conversation.add_reply(content="the second answer", finish_reason="stop", prompt_tokens=3)
    assert [m.pk for m in conversation.shown_messages()][-1] == second.pk  # liveness: a good write replaces it
    assert not Message.objects.get(pk=first.pk).shown


@pytest.mark.django_db
def test_a_turn_that_fails_midway_stores_none_of_it_and_lets_the_claim_go(alice, monkeypatch):
    conversation = asked(alice)
    conversation.add_reply(content="an answer", finish_reason="stop")
    before = list(conversation.messages.values_list("pk", "shown"))

    def fail(*args, **kwargs):
        raise IntegrityError("the database went away mid-turn")

    with monkeypatch.context() as patched:
        patched.setattr(Conversation, "save", fail)  # after the turn's message is written
        for turn, text in (("send", "a new question"), ("edit", "the question reworded")):
            with pytest.raises(IntegrityError):
                conversation.take_turn(turn, text)
            assert list(conversation.messages.values_list("pk", "shown")) == before, f"{turn}: nothing kept"
            assert Conversation.objects.get(pk=conversation.pk).replying_since is None, "the claim is let go"
    taken = conversation.take_turn("send", "a new question")  # liveness: the same turn goes through
    assert taken is not None and conversation.messages.count() == len(before) + 1
