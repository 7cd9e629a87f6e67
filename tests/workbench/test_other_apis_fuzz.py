"""Property-based requests (Hypothesis) to the routes of other clients' APIs, as test_openapi.py sends
them to the OpenAI routes: Anthropic's /v1/messages, OpenAI's /v1/responses, Ollama's /api/chat and
/api/generate, through the ASGI app and the in-process engine. Each case is a valid short request with
one field (the dialect's own, or any name) set to any JSON value, or any JSON object at all. The
properties: never a 500; a refusal is a 4xx in the dialect's own error shape with a message that says
something; a stream carries no error event.

Deterministic (derandomized, no example database): CI sends the same cases every run."""

from __future__ import annotations

import json
import time

import pytest
from django.test import AsyncClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.workbench.test_openapi import JSON_VALUES

pytestmark = pytest.mark.django_db(transaction=True)
CASES = 40  # per route and kind of case: 320 requests in all
ASK = [{"role": "user", "content": "Hi"}]
SAMPLED = {"temperature": 0.8, "seed": 3}  # every sampled case is seeded (a mutation may drop it: still bounded)
ROUTES = {
    # path: (a valid request of two tokens, the dialect's fields, the fields that bound the work)
    "/v1/messages": ({"model": "demo", "messages": ASK, "max_tokens": 2, **SAMPLED},
                     ["model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k",
                      "metadata", "stream", "tools", "tool_choice", "seed", "thinking", "context_management",
                      "output_config"], {"max_tokens"}),
    "/v1/responses": ({"model": "demo", "input": "Hi", "max_output_tokens": 2, "store": False, **SAMPLED},
                      ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "store",
                       "previous_response_id", "text", "tools", "tool_choice", "prompt_cache_key", "seed", "reasoning",
                       "include", "client_metadata"],
                      {"max_output_tokens"}),
    "/api/chat": ({"model": "demo", "messages": ASK, "stream": False, "options": {"num_predict": 2, **SAMPLED}},
                  ["model", "messages", "stream", "options", "format", "keep_alive", "think", "tools"], {"options"}),
    "/api/generate": ({"model": "demo", "prompt": "Hi", "stream": False, "options": {"num_predict": 2, **SAMPLED}},
                      ["model", "prompt", "system", "stream", "options", "format", "raw", "keep_alive"], {"options"}),
}


def bounded(name: str, value: object, bounds: set[str]) -> bool:
    """Whether a mutation keeps the case short: a count at most 2 (or no integer: refused), options of
    any kind but an object (refused) or one with a small num_predict."""
    if name not in bounds:
        return True
    if name == "options" and isinstance(value, dict):
        return type(value.get("num_predict")) is int and 0 < value["num_predict"] <= 2
    return name == "options" or type(value) is not int or value <= 2


def cases(path: str) -> list[dict]:
    base, fields, bounds = ROUTES[path]
    names = st.sampled_from(fields) | st.text(min_size=1, max_size=12)
    mutation = st.tuples(names, JSON_VALUES).filter(lambda nv: bounded(nv[0], nv[1], bounds))
    drawn: list[dict] = []

    @settings(max_examples=CASES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(mutation)
    def mutated(name_value: tuple[str, object]) -> None:
        drawn.append({**base, name_value[0]: name_value[1]})

    @settings(max_examples=CASES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(fields) | st.text(max_size=8), JSON_VALUES, max_size=4))
    def anything(body: dict) -> None:
        drawn.append({**body, **({"options": {"num_predict": 1}} if path.startswith("/api/") else
                                 {"max_tokens": 1, "max_output_tokens": 1})})

    mutated()
    anything()
    return drawn


def error_message(path: str, reply: object) -> object:
    """The message of a refusal, read where the dialect puts it."""
    if path.startswith("/api/"):
        return reply.get("error") if isinstance(reply, dict) else None
    if path == "/v1/messages":
        return reply["error"]["message"] if isinstance(reply, dict) and reply.get("type") == "error" else None
    return reply["error"]["message"] if isinstance(reply, dict) and isinstance(reply.get("error"), dict) else None


def stream_errors(path: str, text: str) -> list[str]:
    """A stream's error events: SSE `event: error` (Messages, Responses, whose Response objects carry
    `"error": null` besides), or Ollama's NDJSON records with an `error`."""
    if not path.startswith("/api/"):
        return [line for line in text.splitlines() if line == "event: error"]
    return [line for line in text.splitlines() if line.strip() and "error" in json.loads(line)]


@pytest.mark.asyncio
@pytest.mark.parametrize("serving_transport", ["inprocess"], indirect=True)
async def test_generated_requests_to_other_apis_get_a_reply_or_their_dialects_error(serving_transport, api_user):
    client, started, statuses = AsyncClient(), time.monotonic(), {}
    for path in ROUTES:
        for body in cases(path):
            response = await client.post(path, data=json.dumps(body), content_type="application/json",
                                         headers={"Authorization": f"Bearer {api_user[1]}"})
            status = response.status_code
            statuses[status] = statuses.get(status, 0) + 1
            if getattr(response, "streaming", False):
                text = b"".join([chunk async for chunk in response.streaming_content]).decode()
                assert status == 200 and not stream_errors(path, text), (path, body, text)
                continue
            reply = json.loads(response.content)
            assert status in (200, 400, 404), (path, status, body, reply)
            if status != 200:
                message = error_message(path, reply)
                assert isinstance(message, str) and message, (path, body, reply)
    print(f"\n{sum(statuses.values())} generated requests in {time.monotonic() - started:.1f}s, statuses {statuses}")
    assert statuses.get(200, 0) > 20 and statuses.get(400, 0) > 20, "both kinds of answer ran"
