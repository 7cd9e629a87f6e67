"""Anthropic's Messages API: POST /v1/messages (whole, or streamed as Anthropic's server-sent events)
and POST /v1/messages/count_tokens.

A thin translation onto the chat-completions route's serving path: the body becomes a chat body
(translate.py), which the chat route checks, admits under the user's limits and submits under the
user's prefix-cache scope (workbench/api/openai/views.py: ChatServing.prepare and start); the reply is
shaped here (reply.py). The key is one of our API tokens, as `x-api-key` (Anthropic's clients) or
`Authorization: Bearer`. Errors are Anthropic's: {"type": "error", "error": {"type", "message"}}.

A stream is the event sequence Anthropic's SDK reads: message_start, then per content block
content_block_start, content_block_delta (text_delta, or one input_json_delta for a tool_use block)
and content_block_stop, then message_delta (stop_reason, stop_sequence, usage) and message_stop. A
failure after the stream began is an `error` event, as Anthropic sends one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from workbench.api import tokenize_limit
from workbench.api.anthropic import reply, translate
from workbench.api.http_api import ApiError, authenticate, json_body
from workbench.api.input_routes import input_route
from workbench.api.openai.views import ERROR_STATUS, SERVINGS, Prepared, Started
from workbench.protocol.request_input import TOO_LONG
from workbench.serving.model_facts import model_length

# Anthropic's error types, by the status we answer with.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_response(exc: ApiError) -> JsonResponse:
    response = JsonResponse(error_body(exc.status, exc.message), status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


async def _prepared(request: HttpRequest, count_only: bool) -> tuple[AbstractBaseUser, dict, Prepared]:
    if request.method != "POST":
        raise ApiError(405, "use POST")
    user = await authenticate(request, api_key_header=True)
    if count_only:  # a template and a tokenization with nothing generated: counted as /tokenize calls are
        await tokenize_limit.check(user.pk)
    body = json_body(request)
    chat = translate.chat_body(body, count_only)
    try:
        prepared = await SERVINGS["chat"].prepare(chat, len(request.body), user, check_length=False)
    except ApiError as exc:
        raise translate.renamed(exc) from None
    # count_tokens counts a prompt of any length. Claude Code reads this wording as "compact the conversation".
    if not count_only and len(prepared.prompt) >= (length := model_length(prepared.model)):
        raise ApiError(400, f"prompt is too long: {len(prepared.prompt)} tokens > {length - 1} maximum",
                       param="messages", code=TOO_LONG)
    return user, body, prepared


@input_route("anthropic", api_key_header=True)
@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponseBase:
    try:
        user, body, prepared = await _prepared(request, count_only=False)
        started = SERVINGS["chat"].start(prepared, user, keep_record=False)
    except ApiError as exc:
        return error_response(exc)
    message = {"id": "msg_" + started.meta["id"].split("-", 1)[1], "type": "message", "role": "assistant",
               "model": prepared.model}
    if body.get("stream"):
        response = StreamingHttpResponse(_events(started, message), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        return response
    return await _whole(started, message)


@input_route("anthropic", api_key_header=True)
@csrf_exempt
async def count_tokens(request: HttpRequest) -> HttpResponseBase:
    """The prompt's tokens as the engine would be given them for the same body (what usage counts)."""
    try:
        _, _, prepared = await _prepared(request, count_only=True)
    except ApiError as exc:
        return error_response(exc)
    return JsonResponse({"input_tokens": len(prepared.prompt)})


async def _whole(started: Started, message: dict[str, Any]) -> JsonResponse:
    text, token_ids, last = await started.whole()
    if last.error_code:
        return error_response(ApiError(ERROR_STATUS.get(last.error_code, 500), last.error or "", code=last.error_code))
    prepared = started.prepared
    content = reply.content(text, prepared.tools, started.choices[0].split)
    stop_reason, stop_sequence = reply.stop_reason(last.finish_reason, any(b["type"] == "tool_use" for b in content),
                                                   token_ids, prepared.tokenizer, list(prepared.params.stop),
                                                   _context_full(prepared, token_ids))
    return JsonResponse({**message, "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                         "usage": reply.usage(last.usage)})


def _context_full(prepared: Prepared, token_ids: list[int]) -> bool:
    """Whether the reply ended where the model's length did, short of max_tokens."""
    asked = prepared.params.max_tokens
    return len(prepared.prompt) + len(token_ids) >= model_length(prepared.model) and (asked is None or len(token_ids) < asked)


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _events(started: Started, message: dict[str, Any]) -> AsyncIterator[str]:
    prepared = started.prepared
    blocks = reply.BlockStream(prepared.tools, started.choices[0].split)
    token_ids: list[int] = []
    # Leaving the group (the client went away mid-stream, even before the first event, or the request
    # failed) stops the sequence: so every yield is inside it.
    async with started.group:
        yield _sse({"type": "message_start", "message": {
            **message, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": len(prepared.prompt), "output_tokens": 0}}})
        async for _, event in started.group:
            token_ids += event.token_ids
            for block_event in blocks.events(event.text, final=event.finished):
                yield _sse(block_event)
            if event.error_code:
                status = ERROR_STATUS.get(event.error_code, 500)
                yield _sse(error_body(status, event.error or event.error_code))
                return
            if event.finished:
                stop_reason, stop_sequence = reply.stop_reason(event.finish_reason, blocks.calls.calls > 0, token_ids,
                                                               prepared.tokenizer, list(prepared.params.stop),
                                                               _context_full(prepared, token_ids))
                yield _sse({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                            "usage": reply.usage(event.usage)})
                yield _sse({"type": "message_stop"})
