"""The OpenAPI 3.1 document of the /v1 API, served at GET /openapi.json (no token).

Written by hand beside the views, with the ranges SamplingParams checks (engine/sampling_params.py),
and kept true by tests/workbench/test_openapi.py: the request fields it lists are exactly those the
views accept (views.accepted_fields), and requests generated from it are answered with a 200
or a structured error naming a field, never a 500.
"""

from __future__ import annotations

import copy
from importlib.metadata import version
from typing import Any

from django.http import HttpRequest, JsonResponse

from engine.sampling_params import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS
from workbench.api.choice_streams import MAX_N


def _nullable(schema: dict) -> dict:
    """The OpenAI API reads a field sent as null as a field left out."""
    return {"anyOf": [schema, {"type": "null"}]}


def _number(minimum: float, maximum: float, exclusive_minimum: bool = False) -> dict:
    low = {"exclusiveMinimum": minimum} if exclusive_minimum else {"minimum": minimum}
    return _nullable({"type": "number", **low, "maximum": maximum})


TOKEN_COUNT = _nullable({"type": "integer", "minimum": 1})
# max_tokens 0 is taken with echo alone (the prompt scored, nothing generated), refused otherwise.
COMPLETION_TOKEN_COUNT = _nullable({"type": "integer", "minimum": 0,
                                    "description": "0 only with echo: true (the prompt scored alone)"})
SAMPLING = {
    "model": {"type": "string",
              "description": "one of the served models (GET /v1/models; left out: the default); another is a 404"},
    "max_tokens": TOKEN_COUNT,
    "max_completion_tokens": TOKEN_COUNT,
    "temperature": _number(0, 100),
    "top_p": _number(0, 1, exclusive_minimum=True),
    "top_k": _nullable({"type": "integer", "minimum": 0}),
    "min_p": _number(0, 1),
    "repetition_penalty": _number(0, 10, exclusive_minimum=True),
    "frequency_penalty": _number(-2, 2),
    "presence_penalty": _number(-2, 2),
    "seed": _nullable({"type": "integer", "minimum": -2**63, "maximum": 2**64 - 1}),
    "stop": _nullable({"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS},
        {"type": "array", "maxItems": MAX_STOP_STRINGS,
         "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}}]}),
    "stop_token_ids": _nullable({"type": "array", "items": {"type": "integer", "minimum": 0}}),
    "min_tokens": _nullable({"type": "integer", "minimum": 0,
                             "description": "at most max_tokens: EOS and stop tokens are masked until then"}),
    "ignore_eos": _nullable({"type": "boolean"}),
    "response_format": _nullable({"type": "object", "required": ["type"], "description":
        "output constrained by a grammar (engine/grammar.py): json_object, json_schema, and llguidance's "
        "regex and Lark grammar", "oneOf": [
            {"properties": {"type": {"enum": ["text", "json_object"]}}, "additionalProperties": False},
            {"properties": {"type": {"const": "json_schema"}, "json_schema": {
                "type": "object", "additionalProperties": False, "properties": {
                    "name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}}}},
             "required": ["type", "json_schema"], "additionalProperties": False},
            {"properties": {"type": {"const": "regex"}, "regex": {"type": "string"}},
             "required": ["type", "regex"], "additionalProperties": False},
            {"properties": {"type": {"const": "grammar"}, "grammar": {"type": "string"}},
             "required": ["type", "grammar"], "additionalProperties": False}]}),
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
    "stream": _nullable({"type": "boolean"}),
    "stream_options": _nullable({"type": "object", "additionalProperties": False,
                                 "properties": {"include_usage": {"type": "boolean"}}}),
    "user": _nullable({"type": "string", "description": "accepted and ignored"}),
    "logit_bias": _nullable({"type": "object", "maxProperties": 0, "description": "not served: only {}"}),
    "suffix": _nullable({"const": "", "description": "not served: only the empty string"}),
}
TOP_N = {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}
PROMPT_LOGPROBS = _nullable({**TOP_N, "description": "vLLM's extension: each prompt token's logprob and the top N "
                                                     "(not with stream)"})
FUNCTION_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": "string", "description": "a JSON object"}}}}}
TOOL = {"type": "object", "required": ["type", "function"], "additionalProperties": False, "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": {"type": "string"},
        "parameters": {"type": "object", "description": "a JSON Schema; a forced call is constrained by it"},
        "strict": {"type": "boolean"}}}}}
TOOL_CHOICE = _nullable({"anyOf": [
    {"enum": ["auto", "none", "required"]},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]})
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
    "tool_calls": {"type": "array", "items": FUNCTION_CALL, "description": "an assistant's earlier calls"},
    "tool_call_id": {"type": "string", "description": "a tool message: the call it answers"},
    "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}}}
CHAT_REQUEST = {"type": "object", "required": ["messages"], "additionalProperties": False, "properties": {
    **SAMPLING,
    "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "logprobs": _nullable({"type": "boolean"}),
    "top_logprobs": _nullable({**TOP_N, "description": "needs logprobs: true"}),
    "echo": _nullable({"const": False, "description": "not served here (on /v1/completions it is): only false"}),
    "prompt_logprobs": PROMPT_LOGPROBS,
    "tools": _nullable({"type": "array", "items": TOOL}),
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": _nullable({"type": "boolean", "description": "one call per turn is made either way"}),
}}
COMPLETION_REQUEST = {"type": "object", "required": ["prompt"], "additionalProperties": False, "properties": {
    **SAMPLING,
    "max_tokens": COMPLETION_TOKEN_COUNT,
    "prompt": {"anyOf": [{"type": "string", "minLength": 1},
                         {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                         {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "minLength": 1}}]},
    "logprobs": _nullable({**TOP_N, "description": "the number of alternatives per token"}),
    "echo": _nullable({"type": "boolean", "description": "the prompt's text (and, with logprobs, its tokens' "
                                                         "logprobs, the first null) ahead of the completion's; "
                                                         "with max_tokens 0, the prompt scored alone"}),
    "prompt_logprobs": PROMPT_LOGPROBS,
}}

USAGE = {"type": "object", "properties": {
    **{k: {"type": "integer"} for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
    "prompt_tokens_details": {"type": "object", "properties": {
        "cached_tokens": {"type": "integer", "description": "prompt tokens found in the prefix cache"}}}}}
TOKEN_LOGPROB: dict[str, Any] = {"type": "object", "properties": {
    "token": {"type": "string"}, "logprob": {"type": "number"},
    "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}}}
CHAT_LOGPROBS = _nullable({"type": "object", "properties": {"content": {"type": "array", "items": {
    **TOKEN_LOGPROB, "properties": {**TOKEN_LOGPROB["properties"],
                                    "top_logprobs": {"type": "array", "items": TOKEN_LOGPROB}}}}}})
COMPLETION_LOGPROBS = _nullable({"type": "object", "properties": {
    "tokens": {"type": "array", "items": {"type": "string"}},
    "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}, "description": "an echoed prompt's "
                                                                                            "first is null"},
    "top_logprobs": {"type": "array", "items": {"anyOf": [
        {"type": "object", "additionalProperties": {"type": "number"}}, {"type": "null"}]}},
    "text_offset": {"type": "array", "items": {"type": "integer"}}}})
FINISH = {"type": ["string", "null"], "enum": ["stop", "length", "tool_calls", "error", None]}


# llama.cpp server's, which open-webui reads (workbench/api/openai/server_timings.py): choice 0's.
TIMINGS = {"type": "object", "properties": {
    **{k: {"type": "integer"} for k in ("cache_n", "prompt_n", "predicted_n")},
    **{k: {"type": ["number", "null"]} for k in ("prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_ms",
                                                 "predicted_per_token_ms", "predicted_per_second")}}}


def _reply(obj: str, choice: dict) -> dict:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"const": obj}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _nullable(USAGE), "timings": TIMINGS,
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "index": {"type": "integer"}, "finish_reason": FINISH, **choice}}}}}


# vLLM's: null for the first prompt token, then token id -> its logprob and text, for the token and the top N.
VLLM_PROMPT_LOGPROBS = {"type": "array", "items": {"anyOf": [{"type": "null"}, {
    "type": "object", "additionalProperties": {"type": "object", "properties": {
        "logprob": {"type": "number"}, "decoded_token": {"type": "string"}}}}]}}
CHAT_REPLY = _reply("chat.completion", {"logprobs": CHAT_LOGPROBS, "message": {"type": "object", "properties": {
    "role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
    "tool_calls": {"type": "array", "items": FUNCTION_CALL}}}})
CHAT_REPLY["properties"]["prompt_logprobs"] = VLLM_PROMPT_LOGPROBS
COMPLETION_REPLY = _reply("text_completion", {"logprobs": COMPLETION_LOGPROBS, "text": {"type": "string"},
                                              "prompt_logprobs": VLLM_PROMPT_LOGPROBS})
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"], "description": "the field refused, where one is"},
        "code": {"type": ["string", "null"]}}}}}
ERRORS = {str(status): {"description": what, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
          for status, what in [(400, "a refused field (error.param names it)"), (401, "no valid API token"),
                               (404, "another model (model_not_found)"), (405, "not POST"),
                               (413, "a body over 256 KiB"),
                               (429, "rate_limited (the user's limits; Retry-After says when)"),
                               (500, "the generation failed"), (503, "overloaded or unavailable"),
                               (504, "timeout (queue wait or request)")]}


def _generation(summary: str, request: str, reply: str) -> dict:
    return {"post": {
        "summary": summary, "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {"200": {"description": "the reply; with stream: true, server-sent events of chunks "
                                             "ending in data: [DONE]",
                              "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{reply}"}},
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                      **ERRORS}}}


TOKEN = {"type": ["object", "null"], "properties": {"id": {"type": "integer"}, "text": {"type": "string"}}}
REPRODUCTION = {"type": "object", "required": ["id", "object", "identical", "first_difference"], "properties": {
    "id": {"type": "string"}, "object": {"const": "reproduction"}, "identical": {"type": "boolean"},
    "first_difference": {"type": ["object", "null"], "description": "where the re-run first parts from the record",
                         "properties": {"index": {"type": "integer"}, "recorded": TOKEN, "reproduced": TOKEN}},
    "distance": {"type": ["number", "null"],
                 "description": "max |logprob difference| of the sampled tokens (where the request kept logprobs)"},
    "same_model": {"type": "boolean"}, "route": {"type": "string"}, "invariant": {"type": "boolean"},
    "recorded_digest": {"type": "string"}, "reproduced_digest": {"type": "string"}}}
REPRODUCE = {"post": {
    "summary": "re-derive one of your own recent requests from its record and compare the bits "
               "(docs/PROTOCOL.md, \"Reproduce\")",
    "security": [{"bearer": []}],
    "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
                    "description": "the id a completion answered with (choice i > 0: `{id}-{i}`)"}],
    "responses": {"200": {"description": "the comparison", "content": {"application/json": {"schema": REPRODUCTION}}},
                  "401": ERRORS["401"],
                  "404": {**ERRORS["404"], "description": "no record of yours by that id (another user's, or "
                                                          "past WORKBENCH_REPRODUCE_RETENTION_S)"},
                  "429": ERRORS["429"], "500": ERRORS["500"], "503": ERRORS["503"]}}}


def _other_api(summary: str, method: str = "post", body: bool = True) -> dict:
    """A route of another client's API: its body and replies are that API's, documented in docs/PROTOCOL.md
    ("Other clients' APIs"), not restated here."""
    operation: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}], "responses": {
        "200": {"description": "the API's own reply (docs/PROTOCOL.md)"}, **{k: ERRORS[k] for k in ("400", "401", "404")}}}
    if body:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
    return {method: operation}


RESPONSE_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]


def document() -> dict:
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {"title": "workbench OpenAI-compatible API", "version": version("workbench"),
                 "description": "docs/PROTOCOL.md, \"OpenAI-compatible HTTP API\": fields not listed are refused"},
        "paths": {
            "/v1/chat/completions": _generation("a chat completion", "ChatCompletionRequest", "ChatCompletion"),
            "/v1/completions": _generation("a completion", "CompletionRequest", "Completion"),
            "/v1/responses": _other_api("OpenAI's Responses API: a response, whole or streamed"),
            "/v1/responses/{response_id}": {
                "parameters": RESPONSE_ID,
                **_other_api("a stored response, its own user's only (another's is a 404)", "get", body=False),
                **_other_api("delete a stored response, its own user's only: {id, object, deleted: true}", "delete",
                             body=False)},
            "/v1/messages": _other_api("Anthropic's Messages API: a message, whole or streamed"),
            "/v1/messages/count_tokens": _other_api("Anthropic's Messages API: the prompt's token count"),
            "/v1/models": {"get": {"summary": "the served models (each live worker's, on the Celery transport)",
                                   "security": [{"bearer": []}], "responses": {
                "200": {"description": "the models requests may name", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array"}}}}}},
                "401": ERRORS["401"]}}},
            "/v1/reproduce/{id}": REPRODUCE,
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "an API token"}},
            "schemas": {"ChatCompletionRequest": CHAT_REQUEST, "CompletionRequest": COMPLETION_REQUEST,
                        "ChatCompletion": CHAT_REPLY, "Completion": COMPLETION_REPLY, "Error": ERROR},
        },
    })


async def openapi_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document())
