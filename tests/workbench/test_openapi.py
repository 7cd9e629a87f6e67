"""GET /openapi.json, kept true: the request fields it lists are exactly those the views accept, and
requests generated from it (hypothesis-jsonschema, through our own runner against the ASGI app and the
in-process engine) get a 200 that matches the document or a structured JSON error naming a field of
the request, never a 500; so do those requests with one field replaced by any JSON value or added
under any name."""

from __future__ import annotations

import copy
import json
import re
import time

import pytest
from django.test import AsyncClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator

from workbench.api.openai import openapi
from workbench.api.openai.views import accepted_fields

pytestmark = pytest.mark.django_db(transaction=True)
SCHEMAS = {"chat": "ChatCompletionRequest", "completion": "CompletionRequest"}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
REPLIES = {"chat": openapi.CHAT_REPLY, "completion": openapi.COMPLETION_REPLY}
CASES = 25  # per endpoint and kind of case: 100 requests in all
COUNTS = {"max_tokens", "max_completion_tokens", "min_tokens", "n"}  # what makes a case slow


@pytest.mark.asyncio
async def test_the_document_is_served_without_a_token_and_lists_exactly_the_fields_the_views_take():
    response = await AsyncClient().get("/openapi.json")
    document = json.loads(response.content)
    assert response.status_code == 200 and document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses",
                                      "/v1/responses/{response_id}", "/v1/messages", "/v1/messages/count_tokens",
                                      "/v1/reproduce/{id}"}
    assert set(document["paths"]["/v1/responses/{response_id}"]) == {"parameters", "get", "delete"}
    for kind, name in SCHEMAS.items():
        schema = document["components"]["schemas"][name]
        assert set(schema["properties"]) == accepted_fields(kind), kind
        assert schema["additionalProperties"] is False
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def quick(schema: dict) -> dict:
    """The request schema with what makes a generation long bounded (a few tokens, two choices)."""
    schema = copy.deepcopy(schema)
    props = schema["properties"]
    props["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": 2}
    props["min_tokens"] = {"type": "integer", "minimum": 0, "maximum": 2}
    props["n"] = {"type": "integer", "minimum": 1, "maximum": 2}
    del props["max_completion_tokens"]
    schema["required"] = [*schema["required"], "max_tokens"]
    if "messages" in props:
        props["messages"]["maxItems"] = 2
    else:
        props["prompt"] = {"anyOf": [{"type": "string", "maxLength": 40},
                                     {"type": "array", "maxItems": 6, "items": {"type": "integer", "minimum": 0}}]}
    return schema


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=6)


def mutated(kind: str, base: st.SearchStrategy) -> st.SearchStrategy:
    """A quick request with one field (the document's, or any name) set to any JSON value."""
    names = st.sampled_from(sorted(accepted_fields(kind))) | st.text(min_size=1, max_size=12)
    change = st.tuples(names, JSON_VALUES).filter(
        lambda nv: not (nv[0] in COUNTS and (nv[1] is None or (type(nv[1]) is int and nv[1] > 2))))
    return st.tuples(base, change).map(lambda pair: {**pair[0], pair[1][0]: pair[1][1]})


def drawn(strategy: st.SearchStrategy, count: int) -> list[dict]:
    """`count` examples, the same on every run (derandomized): our runner then sends them async."""
    cases: list[dict] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: dict) -> None:
        cases.append(case)

    collect()
    return cases


async def answer(client: AsyncClient, path: str, body: dict, token: str) -> tuple[int, object]:
    response = await client.post(path, data=json.dumps(body), content_type="application/json",
                                 headers={"Authorization": f"Bearer {token}"})
    if getattr(response, "streaming", False):
        return response.status_code, b"".join([chunk async for chunk in response.streaming_content]).decode()
    return response.status_code, json.loads(response.content)


@pytest.mark.asyncio
@pytest.mark.parametrize("serving_transport", ["inprocess"], indirect=True)
async def test_generated_requests_get_a_valid_reply_or_an_error_naming_a_field(serving_transport, api_user):
    client, started, sent, statuses = AsyncClient(), time.monotonic(), 0, {}
    for kind, name in SCHEMAS.items():
        base = from_schema(quick(openapi.document()["components"]["schemas"][name]))
        for body in drawn(base, CASES) + drawn(mutated(kind, base), CASES):
            status, reply = await answer(client, PATHS[kind], body, api_user[1])
            sent += 1
            statuses[status] = statuses.get(status, 0) + 1
            assert status in (200, 400, 404), (status, body, reply)
            if status != 200:
                assert isinstance(reply, dict) and isinstance(reply["error"]["message"], str), (body, reply)
                # The field it refused, or a path into one (`messages[1].tool_calls[0].function.arguments`)
                param = reply["error"]["param"]
                assert isinstance(param, str) and (param in body or re.split(r"[.\[]", param)[0] in body), (body, reply)
            elif isinstance(reply, str):  # a stream: chunks, no failure, then [DONE]
                assert reply.endswith("data: [DONE]\n\n") and '"error"' not in reply, (body, reply)
            else:
                Draft202012Validator(REPLIES[kind]).validate(reply)
                assert len(reply["choices"]) == (body.get("n") or 1)
    print(f"\n{sent} generated requests in {time.monotonic() - started:.1f}s, statuses {statuses}")
    assert statuses.get(200, 0) > sent // 10 and statuses.get(400, 0) > sent // 10, "both kinds of answer ran"
