"""The consumers' checks as plain functions, without a socket: the shared prompt/params rules
(workbench/protocol/request_input.py), the websocket API's and the chat's frame checks, and what a chat turn
does to a conversation (Conversation.take_turn)."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from workbench.api import frames as api_frames
from workbench.chat import frames as chat_frames
from workbench.chat.models import Conversation, ReplyUnderWay
from workbench.protocol import request_input
from workbench.protocol.json_socket import FrameError

# Conversation storage: runs on PostgreSQL too (tests/settings_postgres.py).
pytestmark = pytest.mark.postgres


def refusal(check, *args) -> tuple[str, str]:
    """(code, field or echo) of what `check(*args)` refuses."""
    with pytest.raises((request_input.InvalidInput, FrameError)) as caught:
        check(*args)
    error = caught.value
    return error.code, error.param if isinstance(error, request_input.InvalidInput) else error.echo


@pytest.mark.parametrize("values, param", [
    ({"ignore_eos": 1}, "ignore_eos"), ({"ignore_eos": 0}, "ignore_eos"), ({"ignore_eos": "true"}, "ignore_eos"),
    ({"max_tokens": True}, "max_tokens"), ({"max_tokens": 4.0}, "max_tokens"), ({"max_tokens": "4"}, "max_tokens"),
    ({"temperature": False}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": 2.5}, "top_k"), ({"seed": True}, "seed"), ({"stop": [1]}, "stop"), ({"stop": ""}, "stop"),
    ({"logprobs": 2}, "logprobs"), ({"temprature": 1}, "temprature"),
    ("fast", "params"), (None, "params"), ([], "params"), (0, "params"),
])
def test_the_shared_rules_refuse_coerced_values_as_invalid_params(values, param):
    assert refusal(request_input.sampling_params, values) == ("invalid_params", param)


def test_the_shared_rules_take_json_values_over_an_apis_defaults():
    assert request_input.sampling_params({}) == SamplingParams()
    params = request_input.sampling_params({"temperature": 0, "top_p": 1, "ignore_eos": True, "stop": "x"},
                                           {"max_tokens": None, "temperature": 1.0})
    assert params == SamplingParams(max_tokens=None, temperature=0, top_p=1, ignore_eos=True, stop=("x",))
    assert request_input.sampling_params({"logprobs": None}).logprobs is None


@pytest.mark.parametrize("prompt", [[True, 5], [False], [1.0], [5, "a"], 5, None, {"text": "hi"}])
def test_a_prompt_is_text_or_json_integers(prompt):
    assert refusal(request_input.prompt, prompt) == ("invalid_request", "prompt")


def test_good_prompts_pass_as_they_are():
    assert request_input.prompt("hi") == "hi" and request_input.prompt([5, 6]) == [5, 6]


def test_messages_that_are_not_a_list_are_refused_before_the_tokenizer():
    assert refusal(request_input.chat_prompt, None, {"role": "user"}) == ("invalid_request", "messages")


def test_the_api_frames_request_id_rules():
    assert refusal(api_frames.new_request_id, {"request_id": 7}, set()) == ("invalid_request", None)
    assert refusal(api_frames.new_request_id, {"request_id": "x" * 129}, set()) == ("invalid_request", "x" * 129)
    assert refusal(api_frames.new_request_id, {"request_id": "a"}, {"a"}) == ("duplicate_request_id", "a")
    running = {str(n) for n in range(api_frames.MAX_ACTIVE_REQUESTS)}
    assert refusal(api_frames.new_request_id, {"request_id": "new"}, running) == ("too_many_requests", "new")
    assert api_frames.new_request_id({"request_id": "a"}, {"b"}) == "a"
    assert refusal(api_frames.cancelled_request_id, {"request_id": "gone"}, {"a"}) == ("unknown_request_id", "gone")
    assert api_frames.cancelled_request_id({"request_id": "a"}, {"a"}) == "a"
    assert refusal(api_frames.kind, {"type": "launch", "request_id": "r"}) == ("unknown_type", "r")
    assert api_frames.request_id_of({"request_id": "x\ud800"}) is None, "never echo what UTF-8 cannot carry"


def test_a_generate_frame_names_exactly_one_prompt_and_its_params_follow_the_shared_rules():
    assert refusal(api_frames.generation, {"prompt": "a", "messages": []}, None, "r") == ("invalid_request", "r")
    assert refusal(api_frames.generation, {}, None, "r") == ("invalid_request", "r")
    assert refusal(api_frames.generation, {"prompt": [True]}, None, "r") == ("invalid_request", "r")
    bad_params = {"prompt": "hi", "params": {"ignore_eos": 1}}
    assert refusal(api_frames.generation, bad_params, None, "r") == ("invalid_params", "r")
    assert api_frames.generation({"prompt": [5]}, None, "r") == ([5], SamplingParams(), None)
    # `n` rides in params (as in vLLM's SamplingParams) but is the request's, not one sequence's.
    assert api_frames.generation({"prompt": [5], "params": {"n": 3, "seed": 1}}, None, "r") == (
        [5], SamplingParams(seed=1), 3)
    for n in (0, 9, True, 2.0, "2", None):
        assert refusal(api_frames.generation, {"prompt": [5], "params": {"n": n}}, None, "r") == ("invalid_params", "r")


def test_the_chat_frames_rules():
    assert refusal(chat_frames.kind, {"type": "launch"}) == ("unknown_type", None)
    assert [chat_frames.kind({"type": t}) for t in ("send", "regenerate", "edit", "stop")] == \
        ["send", "regenerate", "edit", "stop"]
    for content in (None, "   ", 5, "x" * (chat_frames.MAX_MESSAGE_CHARS + 1)):
        assert refusal(chat_frames.turn_request, "send", {"content": content}) == ("invalid_request", None)
    assert refusal(chat_frames.turn_request, "edit", {"content": "hi", "params": None}) == ("invalid_params", None)
    # The page leaves max_tokens out: the reply may run to the end of the model's context.
    assert chat_frames.turn_request("regenerate", {"content": 5}) == (None, SamplingParams(max_tokens=None))
    assert chat_frames.turn_request("edit", {"content": "new", "params": {"max_tokens": 3}}) == \
        ("new", SamplingParams(max_tokens=3))


@pytest.fixture
def conversation(django_user_model) -> Conversation:
    return Conversation.objects.create(owner=django_user_model.objects.create_user("ann"))


def turns(conversation: Conversation) -> list[tuple[str, str]]:
    """The turns the page shows and the model continues (a regenerated reply's earlier versions aside)."""
    return list(conversation.shown_messages().values_list("role", "content"))


@pytest.mark.django_db
def test_send_stores_the_message_titles_the_conversation_and_keeps_the_claim(conversation):
    history, claim = conversation.take_turn("send", "What is a list?\nAnd a tuple?")
    assert history == [{"role": "user", "content": "What is a list?\nAnd a tuple?"}]
    conversation.add_reply(content="A sequence.", finish_reason="stop")  # the first reply titles it
    assert Conversation.objects.get(pk=conversation.pk).title == "What is a list?"
    with pytest.raises(ReplyUnderWay):  # one reply at a time, until the claim is released
        conversation.take_turn("send", "again")
    conversation.release_reply(claim)
    assert conversation.take_turn("send", "again") is not None


def answered(conversation: Conversation, turn: str, content: str | None, reply: str,
             message_id: int | None = None) -> list[dict[str, str]]:
    history, claim = conversation.take_turn(turn, content, message_id) or pytest.fail("nothing to answer")
    conversation.add_reply(content=reply, finish_reason="stop")
    conversation.release_reply(claim)
    return history


@pytest.mark.django_db
def test_regenerate_sets_the_replies_to_the_last_message_aside_and_edit_keeps_them_on_a_branch(conversation):
    answered(conversation, "send", "one", "first answer")
    answered(conversation, "send", "two", "a")
    history, claim = conversation.take_turn("regenerate", None) or pytest.fail("nothing to answer")
    assert history == [{"role": "user", "content": "one"}, {"role": "assistant", "content": "first answer"},
                       {"role": "user", "content": "two"}]
    assert turns(conversation)[-1] == ("assistant", "a"), "shown until the new version is stored"
    conversation.add_reply(content="b", finish_reason="stop")
    conversation.release_reply(claim)
    assert turns(conversation) == [("user", "one"), ("assistant", "first answer"), ("user", "two"), ("assistant", "b")]
    history, claim = conversation.take_turn("edit", "two, reworded") or pytest.fail("nothing to answer")
    assert turns(conversation) == [("user", "one"), ("assistant", "first answer"), ("user", "two, reworded")]
    assert history == [{"role": r, "content": c} for r, c in turns(conversation)]
    assert conversation.messages.count() == 6, "an edit keeps the old words and both versions of their reply"
    conversation.release_reply(claim)


@pytest.mark.django_db
def test_nothing_to_regenerate_changes_nothing_and_releases_the_claim(conversation):
    assert conversation.take_turn("regenerate", None) is None
    assert conversation.take_turn("edit", "new") is None
    assert turns(conversation) == [] and Conversation.objects.get(pk=conversation.pk).replying_since is None
    Conversation.objects.filter(pk=conversation.pk).delete()
    with pytest.raises(Conversation.DoesNotExist):
        conversation.take_turn("send", "hi")
