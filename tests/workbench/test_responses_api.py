"""OpenAI's Responses API (/v1/responses) through the official `openai` SDK's `client.responses` against
the shared in-process Daphne: a reply whole and streamed, structured output, a function call and its
output continued with previous_response_id, stored replies read back by their own user only, and a
request shaped as Codex sends it (its options, developer items, a namespace of functions, a call in
that namespace sent back with a reasoning item, which the prompt leaves out)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.users import unique_name
from tests.workbench.daphne_session import Session

SEEDED = dict(temperature=1.0, extra_body={"seed": 4, "top_k": 40})  # every sampled request here is seeded
THING = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
         "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                        "color": {"enum": ["red", "green", "blue"]}}}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                          "properties": {"city": {"enum": ["Paris", "Oslo"]}}}}
STREAM_ORDER = ["response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def clients(inprocess_daphne):
    """Two users of this module's own on the shared in-process Daphne, an openai client each."""
    def client() -> openai.OpenAI:
        _, token = Session(inprocess_daphne.address).sign_up(unique_name("responses")).new_token("sdk")
        return openai.OpenAI(base_url=f"http://{inprocess_daphne.address}/v1", api_key=token, max_retries=0)

    return client(), client()


def test_a_reply_whole_and_streamed_is_the_chat_routes_reply(clients):
    sdk, _ = clients
    ask = dict(model="demo", instructions="Be brief.", input="What does the list type do?", max_output_tokens=24,
               store=False, prompt_cache_key="conversation-1", **SEEDED)  # Codex sends a cache key every time
    whole = sdk.responses.create(**ask)
    assert whole.object == "response" and whole.output_text and whole.status in ("completed", "incomplete")
    assert whole.usage.output_tokens > 0 and whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    events = list(sdk.responses.create(stream=True, **ask))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert [k for n, k in enumerate(kinds) if k not in kinds[:n]] == STREAM_ORDER + [f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert "".join(deltas) == done.text == events[-1].response.output_text == whole.output_text
    chat = sdk.chat.completions.create(model="demo", max_tokens=24, seed=4, temperature=1.0, extra_body={"top_k": 40},
                                       messages=[{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "What does the list type do?"}])
    assert chat.choices[0].message.content == whole.output_text


def test_text_format_json_schema_is_structured_output(clients):
    sdk, _ = clients
    shaped = sdk.responses.create(model="demo", input="Describe a thing.", max_output_tokens=40, store=False,
                                  text={"format": {"type": "json_schema", "name": "thing", "schema": THING}}, **SEEDED)
    assert shaped.status == "completed"
    jsonschema.validate(json.loads(shaped.output_text), THING)


def test_a_call_its_output_and_the_stored_replies_are_their_users_alone(clients):
    sdk, other = clients
    asked = sdk.responses.create(model="demo", input="Weather in Oslo?", max_output_tokens=40, tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"}, **SEEDED)
    [call] = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    follow = sdk.responses.create(model="demo", previous_response_id=asked.id, max_output_tokens=8, tools=[WEATHER],
                                  tool_choice="none", input=[{"type": "function_call_output", "call_id": call.call_id,
                                                               "output": "Sunny, 21 C"}], **SEEDED)
    assert follow.previous_response_id == asked.id and follow.output_text
    # The follow-up's prompt is the first turn, its call and the call's output, as chat messages give it.
    chat_tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    as_chat = sdk.chat.completions.create(model="demo", max_tokens=1, tools=[chat_tool], tool_choice="none", seed=4,
                                          messages=[{"role": "user", "content": "Weather in Oslo?"},
                                                    {"role": "assistant", "content": None, "tool_calls": [
                                                        {"id": call.call_id, "type": "function", "function": {
                                                            "name": call.name, "arguments": call.arguments}}]},
                                                    {"role": "tool", "tool_call_id": call.call_id,
                                                     "content": "Sunny, 21 C"}])
    assert follow.usage.input_tokens == as_chat.usage.prompt_tokens
    assert sdk.responses.retrieve(follow.id).model_dump() == follow.model_dump()

    for response_id in (asked.id, follow.id):
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(response_id)
    with pytest.raises(openai.NotFoundError) as caught:
        other.responses.create(model="demo", previous_response_id=asked.id, input="And Paris?", max_output_tokens=4,
                               **SEEDED)
    assert caught.value.body["param"] == "previous_response_id"
    unstored = sdk.responses.create(model="demo", input="Hi", max_output_tokens=2, store=False, **SEEDED)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)


@pytest.mark.parametrize("ask, param", [
    (dict(input="Hi", extra_body={"frequency_penalty": 1}), "frequency_penalty"),
    (dict(input="Hi", tools=[{"type": "web_search"}]), "tools[0].type"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), "input[0].content[0].type"),
    (dict(input="Hi", max_output_tokens=0), "max_output_tokens"),
    (dict(input="Hi", reasoning={"effort": "extreme"}), "reasoning.effort"),
    (dict(input="Hi", include=["message.output_text.logprobs"]), "include"),
    (dict(input="Hi", include=[{"not": "a string"}]), "include"),
    (dict(input="Hi", tools=[{"type": "namespace", "name": "", "tools": [WEATHER]}]), "tools[0].name"),
    (dict(input="Hi", tools=[{"type": "namespace", "name": "n", "description": 7, "tools": [WEATHER]}]),
     "tools[0].description"),
    (dict(input="Hi", tools=[{"type": "namespace", "name": "agents", "tools": [{"type": "web_search"}]}]),
     "tools[0].tools[0].type"),
])
def test_a_bad_request_is_refused_naming_the_field(clients, ask, param):
    with pytest.raises(openai.BadRequestError) as caught:
        clients[0].responses.create(model="demo", **ask)
    assert caught.value.body["param"] == param, caught.value.body


AGENTS = {"type": "namespace", "name": "mcp__helpers__", "description": "Tools for managing helpers.",
          "tools": [{"type": "function", "name": "close_agent", "description": "Close a helper.", "strict": False,
                     "parameters": {"type": "object", "additionalProperties": False, "required": ["target"],
                                    "properties": {"target": {"enum": ["a1", "a2"]}}}}]}
# What Codex sends with every request besides its input and tools.
CODEX_OPTIONS = {"reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
                 "client_metadata": {"session_id": "s-1", "turn_id": "t-1"}, "prompt_cache_key": "s-1",
                 "seed": 4, "top_k": 40}


def codex_input(question: str) -> list[dict]:
    return [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}]


def test_codexs_request_is_served_and_a_namespaced_call_goes_out_and_comes_back(clients):
    sdk, _ = clients
    ask = dict(model="demo", max_output_tokens=40, store=False, parallel_tool_calls=True, temperature=1.0)
    events = list(sdk.responses.create(input=codex_input("Close helper a1."), tools=[WEATHER, AGENTS],
                                       tool_choice="auto", stream=True, extra_body=CODEX_OPTIONS, **ask))
    done = events[-1].response
    assert done.status in ("completed", "incomplete") and done.usage.output_tokens > 0, events[-1]
    without = sdk.responses.create(input=codex_input("Close helper a1."), tools=[WEATHER], tool_choice="auto",
                                   extra_body=CODEX_OPTIONS, **ask)
    assert without.usage.input_tokens < done.usage.input_tokens, "the namespace's function is in the prompt"

    # The namespace's function, the only tool offered, forced: its call names the namespace apart.
    called = sdk.responses.create(input=codex_input("Close helper a1."), tools=[AGENTS], tool_choice="required",
                                  extra_body=CODEX_OPTIONS, **{**ask, "max_output_tokens": 80})
    [call] = [item.model_dump(exclude_none=True) for item in called.output if item.type == "function_call"]
    assert (call["namespace"], call["name"]) == ("mcp__helpers__", "close_agent"), call
    assert json.loads(call["arguments"])["target"] in ("a1", "a2")
    # Codex sends the call back (stateless: store false) with a reasoning item, which the prompt leaves out.
    answered = codex_input("Close helper a1.") + [
        {k: v for k, v in call.items() if k != "status"},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"}]
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "b3BhcXVl"}
    follow = dict(tools=[AGENTS], tool_choice="none", extra_body=CODEX_OPTIONS, **{**ask, "max_output_tokens": 2})
    plain = sdk.responses.create(input=answered, **follow)
    assert plain.usage.input_tokens > sdk.responses.create(input=answered[:2], **follow).usage.input_tokens, \
        "the call and its output are in the prompt"
    assert sdk.responses.create(input=answered[:2] + [reasoning] + answered[2:], **follow).usage.input_tokens \
        == plain.usage.input_tokens
    other_namespace = answered[:2] + [{**answered[2], "namespace": "others"}] + answered[3:]
    assert sdk.responses.create(input=other_namespace, **follow).usage.input_tokens != plain.usage.input_tokens, \
        "liveness: the call's namespace is part of the prompt"


def test_a_stored_namespaced_call_is_continued_with_the_prompt_of_one_sent_back(clients):
    """previous_response_id carries the call as the request's own tools name it, a name past the chat
    route's 64 characters included."""
    sdk, _ = clients
    tool = {**AGENTS["tools"][0], "name": "close_the_helper_agent_named_by_its_target_and_report_back"}
    long_namespace = {**AGENTS, "name": "mcp__a_server_with_a_rather_long_name__", "tools": [tool]}
    ask = dict(model="demo", tools=[long_namespace], extra_body=CODEX_OPTIONS, temperature=1.0)
    called = sdk.responses.create(input=codex_input("Close helper a1."), tool_choice="required", max_output_tokens=120,
                                  **ask)
    [call] = [item.model_dump(exclude_none=True) for item in called.output if item.type == "function_call"]
    assert (call["namespace"], call["name"]) == (long_namespace["name"], tool["name"]), call
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"}
    stored = sdk.responses.create(previous_response_id=called.id, input=[output], tool_choice="none",
                                  max_output_tokens=2, **ask)
    sent_back = sdk.responses.create(input=codex_input("Close helper a1.") + [
        {k: v for k, v in call.items() if k != "status"}, output], tool_choice="none", max_output_tokens=2, store=False,
        **ask)
    assert stored.usage.input_tokens == sent_back.usage.input_tokens
