"""Structured output and tools through the official `openai` client, unchanged, on a real Daphne serving
SmolLM2 in-process (the session's shared one, tests/conftest.py): 20 seeded sampled json_object and 20
json_schema requests, all 40 sent at once so that the engine batches them, all parse (and validate); a
json_schema answer that validates, streamed and not; tool_choice="required" giving a valid call
(streamed as tool-call deltas too), the tool's result sent back and answered; and bad tools or
response_format refused naming the field. SmolLM2's chat template takes no tools, so this is also the
system-prompt path (workbench/api/openai/tool_calls.py)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                                                                                "maximum": 120}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 30}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {},
                                                        "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(smollm2_daphne):
    # A request here takes seconds on a quiet machine, minutes on a loaded 2-core one (40 at once, at load 20).
    return openai.OpenAI(base_url=f"http://{smollm2_daphne.address}/v1", api_key=smollm2_daphne.token, max_retries=0,
                         timeout=900)


PET_PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
              "properties": {"name": {"type": "string", "maxLength": 16},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120},
                             "pet": {"enum": ["cat", "dog", "none"]}}}
FORMATS = {"json_object": {"type": "json_object"},
           "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": PET_PERSON}}}


def test_twenty_seeded_sampled_requests_of_each_format_sent_at_once_parse_and_validate(client):
    # Told the shape, the model ends its object in time; 64 tokens is about twice what such an object takes.
    messages = [{"role": "system", "content": 'You answer with one short JSON object, like {"name": "Ann", "age": 30, '
                                              '"pet": "cat"}.'},
                {"role": "user", "content": "Invent a person: name, age and pet."}]

    def ask(kind: str, seed: int):
        return client.chat.completions.create(model="smollm2", messages=messages, max_tokens=64, temperature=0.6,
                                              top_p=0.9, seed=seed, response_format=FORMATS[kind])

    # All 40 at once: the engine runs them as one batch, constrained rows of two kinds side by side, rather
    # than two batches one after the other (the cost is in the steps, and the slowest row sets their number).
    with ThreadPoolExecutor(max_workers=40) as pool:
        sent = {kind: [pool.submit(ask, kind, seed) for seed in range(20)] for kind in FORMATS}
        replies = {kind: [future.result() for future in futures] for kind, futures in sent.items()}
    for kind, answers in replies.items():
        texts = [reply.choices[0].message.content for reply in answers]
        values = [json.loads(text) for text in texts]
        assert all(isinstance(value, dict) for value in values), (kind, texts)
        assert {reply.choices[0].finish_reason for reply in answers} == {"stop"}  # the EOS the grammar allowed
        if kind == "json_schema":
            for value in values:
                jsonschema.validate(value, PET_PERSON)
        assert len(set(texts)) > 5, "liveness: seeded sampling still varies within the grammar"


def test_json_schema_answers_validate_streamed_and_whole(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    messages = [{"role": "user", "content": "Invent a person. Answer in JSON with name and age."}]
    for seed in (1,):
        whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=40, temperature=0.8,
                                               seed=seed, response_format=fmt)
        jsonschema.validate(json.loads(whole.choices[0].message.content), PERSON)
        assert whole.choices[0].finish_reason == "stop"
        chunks = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=40, temperature=0.8,
                                                seed=seed, response_format=fmt, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    plain = client.completions.create(model="smollm2", prompt="A person as JSON:", max_tokens=40, temperature=0,
                                      extra_body={"response_format": fmt})  # the client has no such argument here
    jsonschema.validate(json.loads(plain.choices[0].text), PERSON)


def test_required_tool_call_then_the_result_is_answered(client):
    first = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=60, temperature=0.7, seed=3)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)

    streamed = list(client.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=60,
        temperature=0.7, seed=3, stream=True))
    deltas = [t for c in streamed for t in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == call.function.name and deltas[0].id.startswith("call_")
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert streamed[-1].choices[0].finish_reason == "tool_calls"

    back = ASK + [choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "clear"}'}]
    answer = client.chat.completions.create(model="smollm2", messages=back, tools=[WEATHER, TIME], max_tokens=30,
                                            temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.content


def test_a_named_function_is_the_one_called(client):
    # Sampled at OpenAI's default temperature 1, so seeded: an unseeded draw may run past max_tokens.
    named = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, TIME], max_tokens=40, seed=4,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments), dict)


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tools_and_formats_are_refused_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4, **fields)
    assert refused.value.body["param"] == param
