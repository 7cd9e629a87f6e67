"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official `anthropic`
SDK against the shared in-process Daphne: a message, its stream, stop reasons, a tool_use round trip,
count_tokens against what the engine was given, errors in Anthropic's shape, and a request shaped as
Claude Code sends it (its options, a system message among the messages, a deferred tool, max_tokens
past the model's length), with a prompt too long for the model refused before the stream opens."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import anthropic
import jsonschema
import openai
import pytest

from tests.users import unique_name
from tests.workbench.daphne_session import Session

ASK = [{"role": "user", "content": [{"type": "text", "text": "What does the list type do?"}]}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                            "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}
DEMO_LENGTH = 512  # the demo model's length in tokens (its config's max_position_embeddings)
# Every sampled request here is seeded. The SDK has no arguments for the sampling fields (the API takes them).
SAMPLED = dict(extra_body={"temperature": 1.0, "top_k": 40, "seed": 4})


@pytest.fixture(scope="module")
def served(inprocess_daphne):
    """(address, an API token of a user of this module's own) on the shared in-process Daphne."""
    _, token = Session(inprocess_daphne.address).sign_up(unique_name("anthropic")).new_token("sdk")
    return inprocess_daphne.address, token


def client(served, **kwargs) -> anthropic.Anthropic:
    """The SDK sends its api_key as `x-api-key`, as Claude Code sends ANTHROPIC_API_KEY's."""
    address, token = served
    return anthropic.Anthropic(base_url=f"http://{address}", **({"default_headers": {"x-api-key": token}} | kwargs),
                               max_retries=0)


def test_a_message_and_its_stream_are_the_same_reply(served):
    sdk = client(served)
    ask = dict(model="demo", max_tokens=24, system="You answer briefly.", messages=ASK, **SAMPLED)
    whole = sdk.messages.create(**ask)
    [block] = whole.content
    assert block.type == "text" and block.text and whole.role == "assistant" and whole.model == "demo"
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens > 0
    with sdk.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == final.content[0].text == block.text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)

    # The same request as a chat completion: one serving path, the same tokens.
    address, token = served
    chat = openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0).chat.completions.create(
        model="demo", max_tokens=24, temperature=1.0, seed=4, extra_body={"top_k": 40},
        messages=[{"role": "system", "content": "You answer briefly."},
                  {"role": "user", "content": "What does the list type do?"}])
    assert chat.choices[0].message.content == block.text


def test_stop_reasons_name_the_stop_sequence_and_max_tokens(served):
    sdk = client(served)
    ask = dict(model="demo", messages=ASK, **SAMPLED)
    whole = sdk.messages.create(max_tokens=24, **ask).content[0].text
    word = whole.split()[2]  # a word the seeded reply writes, past its start
    stopped = sdk.messages.create(max_tokens=24, stop_sequences=["@@never@@", word], **ask)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert whole.startswith(stopped.content[0].text) and word not in stopped.content[0].text
    with sdk.messages.stream(max_tokens=24, stop_sequences=[word], **ask) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", word,
                                                                               stopped.content[0].text)
    short = sdk.messages.create(max_tokens=3, **ask)
    assert (short.stop_reason, short.stop_sequence, short.usage.output_tokens) == ("max_tokens", None, 3)


def test_a_forced_tool_use_and_its_result_make_a_round_trip(served):
    sdk = client(served)
    forced = dict(model="demo", max_tokens=60, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                  **SAMPLED)
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    call = sdk.messages.create(messages=asked, **forced)
    assert call.stop_reason == "tool_use"
    [use] = [b for b in call.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    with sdk.messages.stream(messages=asked, **forced) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == use.input
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert "input_json" in events and events.index("content_block_start") < events.index("content_block_stop")

    answered = asked + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in call.content]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                      "content": [{"type": "text", "text": "Sunny, 21 C"}]},
                                                     {"type": "text", "text": "So?"}]}]
    back = dict(model="demo", max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"}, messages=answered)
    after = sdk.messages.create(**back, **SAMPLED)
    assert after.stop_reason in ("end_turn", "max_tokens") and after.content[0].type == "text"
    # The result reached the prompt: the engine was given what count_tokens counts, which grows with it.
    counted = sdk.messages.count_tokens(**{k: v for k, v in back.items() if k != "max_tokens"}).input_tokens
    assert counted == after.usage.input_tokens + after.usage.cache_read_input_tokens
    longer = json.loads(json.dumps(answered))
    longer[2]["content"][0]["content"][0]["text"] += " and dry all week"
    assert sdk.messages.count_tokens(model="demo", tools=[WEATHER], tool_choice={"type": "none"},
                                     messages=longer).input_tokens > counted


def test_count_tokens_is_the_prompt_the_engine_is_given(served):
    sdk = client(served, default_headers={}, auth_token=served[1])  # Authorization: Bearer works as x-api-key does
    body = dict(model="demo", system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                messages=ASK)
    counted = sdk.messages.count_tokens(**body).input_tokens
    sent = sdk.messages.create(max_tokens=2, metadata={"user_id": "u-1"}, **body, **SAMPLED)
    assert counted == sent.usage.input_tokens + sent.usage.cache_read_input_tokens
    address, token = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK[0]["content"][0]["text"]}]
    tokenize = urllib.request.Request(f"http://{address}/tokenize", headers={"Authorization": f"Bearer {token}"},
                                      data=json.dumps({"messages": messages}).encode())
    assert json.loads(urllib.request.urlopen(tokenize, timeout=30).read())["count"] == counted


@pytest.mark.parametrize("ask, param", [
    (dict(messages=ASK, max_tokens=4, extra_body={"service_tier": "auto"}), "service_tier"),
    (dict(messages=ASK, max_tokens=4, thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
    (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}], max_tokens=4), "image"),
    (dict(messages=ASK, max_tokens=4, stop_sequences=[""]), "stop_sequences"),
    (dict(messages=ASK, max_tokens=4, tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), "tool_choice"),
    (dict(messages=[{"role": "user", "content": []}], max_tokens=4), "messages[0].content"),
    (dict(messages=ASK, max_tokens=4, thinking={"type": "adaptive", "display": "full"}), "thinking.display"),
    (dict(messages=ASK, max_tokens=4, extra_body={"context_management": {"edits": [
        {"type": "clear_tool_uses_20250919"}]}}), "context_management.edits[0]"),
    (dict(messages=ASK, max_tokens=4, extra_body={"output_config": {"effort": "hihg"}}), "output_config.effort"),
    (dict(messages=ASK, max_tokens=4, extra_body={"output_config": {"format": {"type": "json_object"}}}),
     "output_config.format"),
    (dict(messages=ASK, max_tokens=4, tools=[{**WEATHER, "defer_loading": "yes"}]), "tools[0].defer_loading"),
    (dict(messages=[{"role": "system", "output_config": {"effort": "high"}}], max_tokens=4), "at least one message"),
    (dict(messages=ASK + [{"role": "system", "output_config": {"format": {}}}], max_tokens=4),
     "messages[1].output_config.format"),
])
def test_a_bad_request_gets_anthropics_error_shape_naming_the_field(served, ask, param):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(served).messages.create(model="demo", **ask)
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert param in body["error"]["message"], body


def test_max_tokens_is_required_as_anthropic_requires_it(served):
    address, token = served  # the SDK will not send a request without it: plain HTTP does
    request = urllib.request.Request(f"http://{address}/v1/messages", headers={"x-api-key": token},
                                     data=json.dumps({"model": "demo", "messages": ASK}).encode())
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400 and json.loads(caught.value.read()) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}


def test_keys_and_models_are_refused_in_anthropics_shape(served):
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(served, default_headers={"x-api-key": "wb_wrong"}).messages.create(model="demo", max_tokens=4, messages=ASK)
    assert caught.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        client(served).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error" and "'demo'" in missing.value.body["error"]["message"]


def claude_code_body(**changes) -> dict:
    """A body shaped as Claude Code 2.1 sends every request (its fields and block kinds, our own texts)."""
    cached = {"type": "ephemeral"}
    return {"model": "demo", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": "x-billing-header: a line the client adds"},
                       {"type": "text", "text": "You answer briefly.", "cache_control": cached}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What does the list type do?",
                                                       "cache_control": cached}]},
                         {"role": "system", "content": [{"type": "text", "text": "The working directory is /tmp."}]}],
            "tools": [WEATHER, {**WEATHER, "name": "later_tool", "defer_loading": True}],
            "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"}, "temperature": 1.0, "seed": 11, **changes}


def post(served, path: str, body: dict) -> tuple[int, bytes]:
    address, token = served
    request = urllib.request.Request(f"http://{address}{path}", data=json.dumps(body).encode(), headers={
        "x-api-key": token, "anthropic-beta": "claude-code-20250219,context-management-2025-06-27"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def count(served, body: dict) -> int:
    """count_tokens of a Messages body (its prompt's fields only)."""
    fields = {k: v for k, v in body.items() if k in ("model", "messages", "system", "tools", "tool_choice", "thinking",
                                                     "context_management", "output_config")}
    status, answer = post(served, "/v1/messages/count_tokens?beta=true", fields)
    assert status == 200, answer
    return json.loads(answer)["input_tokens"]


def test_claude_codes_request_is_served_with_its_system_message_and_deferred_tool_in_the_prompt(served):
    body = claude_code_body()
    sdk = client(served)
    with sdk.messages.stream(**{k: v for k, v in body.items() if k in ("model", "max_tokens", "system", "messages",
                                                                       "tools", "metadata", "thinking")},
                             extra_body={k: body[k] for k in ("context_management", "output_config", "temperature",
                                                              "seed")},
                             extra_query={"beta": "true"}) as stream:
        final = stream.get_final_message()
    # max_tokens is far past the model's length: the reply ends by itself or where the length does.
    assert final.stop_reason in ("end_turn", "tool_use", "model_context_window_exceeded"), final
    assert final.content and final.usage.output_tokens > 0
    counted = count(served, body)
    assert counted == final.usage.input_tokens + final.usage.cache_read_input_tokens
    # The system message among the messages and the deferred tool are in the prompt the model was given; a
    # turn's own effort changes nothing.
    assert count(served, {**body, "messages": body["messages"][:1]}) < counted
    assert count(served, {**body, "messages": body["messages"] + [
        {"role": "system", "output_config": {"effort": "low"}}]}) == counted
    assert count(served, {**body, "tools": body["tools"][:1]}) < counted


def test_earlier_thinking_blocks_are_left_out_of_the_prompt(served):
    said = [{"type": "text", "text": "It holds items in order."}]
    thought = [{"type": "thinking", "thinking": "The user asks about lists. " * 8, "signature": "c2ln"},
               {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}]
    turns = [ASK[0], {"role": "assistant", "content": said}, {"role": "user", "content": "And a tuple?"}]
    with_thinking = [ASK[0], {"role": "assistant", "content": thought + said}, turns[2]]
    plain = count(served, {"model": "demo", "messages": turns})
    assert count(served, {"model": "demo", "messages": with_thinking}) == plain
    # A turn of thinking alone stays a turn (empty), so user and assistant still take turns.
    thinking_alone = [ASK[0], {"role": "assistant", "content": thought}, turns[2]]
    assert count(served, {"model": "demo", "messages": thinking_alone}) == count(
        served, {"model": "demo", "messages": [ASK[0], {"role": "assistant", "content": ""}, turns[2]]})
    assert count(served, {"model": "demo", "messages": [ASK[0], {"role": "assistant", "content": [
        {"type": "text", "text": "The user asks about lists. " * 8}] + said}, turns[2]]}) > plain, \
        "liveness: the same words as text are in the prompt"


def test_a_prompt_past_the_models_length_is_refused_before_the_stream_opens(served):
    long = [{"role": "user", "content": "lists and tuples " * 400}]
    tokens = count(served, {"model": "demo", "messages": long})
    assert tokens >= DEMO_LENGTH, "liveness: the prompt is longer than the model"
    status, answer = post(served, "/v1/messages?beta=true", claude_code_body(messages=long, system="Be brief."))
    assert status == 400, answer[:300]
    error = json.loads(answer)["error"]
    # Anthropic's wording, which Claude Code reads as "compact the conversation".
    assert error["type"] == "invalid_request_error"
    assert re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["message"]).groups() == (
        str(count(served, {"model": "demo", "messages": long, "system": "Be brief.",
                           "tools": claude_code_body()["tools"]})), str(DEMO_LENGTH - 1)), error

    address, token = served  # the chat route refuses it before its stream too, with OpenAI's code
    with pytest.raises(openai.BadRequestError) as caught:
        openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0).chat.completions.create(
            model="demo", messages=long, max_tokens=4, stream=True, seed=1)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "messages"
    assert f"prompt has {tokens} tokens; this model's length is {DEMO_LENGTH}" in caught.value.body["message"]


def test_a_reply_the_models_length_ends_says_so_and_one_max_tokens_ends_says_that(served):
    def asking(words: int) -> list[dict]:
        return [{"role": "user", "content": "x" + " x" * words}]

    words = DEMO_LENGTH - 2 - count(served, {"model": "demo", "messages": asking(0)})  # " x" is one token
    asked = asking(words)
    assert count(served, {"model": "demo", "messages": asked}) == DEMO_LENGTH - 2, "two tokens of room"
    sdk = client(served)
    full = sdk.messages.create(model="demo", max_tokens=4096, messages=asked, **SAMPLED)  # the SDK streams past 21,333
    assert (full.stop_reason, full.usage.output_tokens) == ("model_context_window_exceeded", 2), full
    capped = sdk.messages.create(model="demo", max_tokens=2, messages=asked, **SAMPLED)
    assert (capped.stop_reason, capped.usage.output_tokens) == ("max_tokens", 2), capped
    with sdk.messages.stream(model="demo", max_tokens=32000, messages=asked, **SAMPLED) as stream:
        assert stream.get_final_message().stop_reason == "model_context_window_exceeded"


def test_output_config_format_answers_json_matching_the_schema(served):
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
              "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1,
                                                                          "maximum": 7}}}
    reply = client(served).messages.create(model="demo", max_tokens=40, messages=ASK,
                                           extra_body={"output_config": {"format": {"type": "json_schema",
                                                                                    "schema": schema}},
                                                       "temperature": 1.0, "seed": 5})
    assert reply.stop_reason == "end_turn", reply
    jsonschema.validate(json.loads(reply.content[0].text), schema)
