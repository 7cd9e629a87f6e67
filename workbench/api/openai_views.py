"""The OpenAI-compatible HTTP API: /v1/models, /v1/completions, /v1/chat/completions.

Same engine, same tokens as the websocket API. `stream: true` answers with server-sent events ending
in `data: [DONE]`; `stream_options.include_usage` adds a last chunk with the usage. A client that
disconnects mid-stream aborts its sequence. Errors use OpenAI's shape: {"error": {message, type,
param, code}} with a 4xx status. The prompt, the messages and the sampling values are checked by the
rules every API shares (workbench/api/request_input.py), with its error codes; this module maps OpenAI's
field names onto them and refuses the fields it does not serve.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import SamplingParams
from engine.sampling_params import is_integer
from workbench.api import request_input, tool_calls
from workbench.api.http_api import ApiError, authenticate, check_model, json_body, refuse_unless_off
from workbench.api.openai_usage import openai_usage
from workbench.serving import bridge, limits
from workbench.serving.streams import StreamEvent

# OpenAI request fields -> SamplingParams fields. Others are refused by name, except these, which
# clients send routinely and which change nothing here.
FIELD_MAP = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
             "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
             "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
             "repetition_penalty": "repetition_penalty", "ignore_eos": "ignore_eos",
             "response_format": "response_format"}
IGNORED = {"model", "user", "n", "stream", "stream_options", "prompt", "messages"}
# Served by OpenAI, not here: each accepted only when off (LangChain sends logit_bias: {} on every request).
OFF_ONLY: dict[str, object] = {"logit_bias": {}, "echo": False, "suffix": ""}
FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "canceled": "stop"}
# A failed generation's HTTP status; anything else is 500. OpenAI's clients retry 429 and 5xx by themselves.
ERROR_STATUS = {"invalid_request": 400, "invalid_params": 400, "rate_limited": 429, "overloaded": 503,
                "unavailable": 503, "timeout": 504}


def _body(request: HttpRequest) -> dict:
    body = json_body(request)
    # Checked here, before any is used: a wrong type would otherwise fail after the stream started.
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict)
                                or not isinstance(options.get("include_usage", False), bool)):
        raise ApiError(400, "stream_options must be an object like {\"include_usage\": true}", param="stream_options")
    check_model(body)
    return body


def _tools(kind: str, body: dict) -> tool_calls.Tools:
    """The chat request's tools (none for a plain completion, which refuses the fields by name)."""
    if kind != "chat":
        return tool_calls.Tools((), "none")
    try:
        return tool_calls.tools_of(body)
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


def _params(kind: str, body: dict, tools: tool_calls.Tools) -> SamplingParams:
    both = body.get("max_tokens"), body.get("max_completion_tokens")
    if None not in both and both[0] != both[1]:
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; send one", param="max_completion_tokens")
    # Without max_tokens a chat reply may run to the end of the model's context, as in vLLM; a plain
    # completion keeps OpenAI's default of 16 tokens.
    values = {"max_tokens": None} if kind == "chat" else {}
    for key, value in body.items():
        if key in FIELD_MAP:
            if value is not None:
                values[FIELD_MAP[key]] = value
        elif key not in IGNORED and key not in OFF_ONLY and not (kind == "chat" and key in tool_calls.FIELDS):
            raise ApiError.unsupported(key)
    refuse_unless_off(body, OFF_ONLY)
    n = body.get("n", 1)
    if n is not None and (not is_integer(n) or n != 1):
        raise ApiError(400, "only n=1 is supported", param="n")
    try:
        return tools.apply(request_input.sampling_params(values))
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


def _handler(kind: str):
    """A view for `kind` ("chat" or "completion"): authenticate, check, then answer whole or streamed."""

    async def view(request: HttpRequest) -> HttpResponseBase:
        try:
            if request.method != "POST":
                raise ApiError(405, "use POST")
            user = await authenticate(request)
            body = _body(request)
            tools = _tools(kind, body)
            params = _params(kind, body, tools)
            transport = await bridge.transport_from_loop()
            prompt = _prompt(kind, body, transport, tools)
            admission = _admit(user.get_username())
        except ApiError as exc:
            return exc.response()
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        stream = admission.submit(transport, request_id, prompt, params)
        meta = {"id": request_id, "created": int(time.time()), "model": settings.WORKBENCH_MODEL}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = StreamingHttpResponse(_sse(kind, stream, transport, meta, include_usage, tools),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            return response
        return await _whole(kind, stream, transport, meta, tools)

    return csrf_exempt(view)


def _admit(user: str) -> limits.Admission:
    try:
        return limits.admit(user)
    except limits.Refused as exc:
        raise ApiError(ERROR_STATUS[exc.code], exc.message, code=exc.code,
                       kind="rate_limit_error" if exc.code == "rate_limited" else "server_error",
                       retry_after=exc.retry_after) from None


def _prompt(kind: str, body: dict, transport, tools: tool_calls.Tools) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # OpenAI accepts a list of prompts; one is what n=1 serves
    try:
        if kind == "chat":
            messages, shown = tool_calls.messages_for(body.get("messages"), tools, transport.tokenizer.takes_tools)
            return request_input.chat_prompt(transport.tokenizer, messages, tools=shown)
        return request_input.prompt(prompt)
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


async def _whole(kind: str, stream, transport, meta: dict, tools: tool_calls.Tools) -> HttpResponse:
    text, event = "", StreamEvent()  # a stream always ends with its finished event
    try:
        async for event in stream:
            text += event.text
    except asyncio.CancelledError:
        transport.cancel(meta["id"])
        raise
    assert event is not None  # a stream ends with its finished event
    if event.error_code:
        status = ERROR_STATUS.get(event.error_code, 500)
        return ApiError(status, event.error or "", code=event.error_code,
                        kind="invalid_request_error" if status == 400 else "server_error").response()
    finish = FINISH_REASONS.get(event.finish_reason or "", event.finish_reason)
    choice: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if kind == "chat":
        content, calls = tool_calls.parse(text, tools)
        choice["message"] = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        choice["finish_reason"] = tool_calls.finish_reason(finish, bool(calls))
        obj = "chat.completion"
    else:
        choice["text"] = text
        obj = "text_completion"
    return JsonResponse({**meta, "object": obj, "choices": [choice], "usage": openai_usage(event.usage)})


async def _sse(kind: str, stream, transport, meta: dict, include_usage: bool, tools: tool_calls.Tools):
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    calls = tool_calls.CallStream(tools)

    def chunk(choices, usage=None) -> str:
        payload = {**meta, "object": obj, "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    finished = False
    try:
        if kind == "chat":
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        async for event in stream:
            if event.error_code:
                if event.text:  # what was generated before the failure (a stream interval holds it back)
                    body = {"delta": {"content": event.text}} if kind == "chat" else {"text": event.text}
                    yield chunk([{"index": 0, **body, "finish_reason": None, "logprobs": None}])
                error = {"message": event.error, "type": "server_error", "code": event.error_code}
                yield f"data: {json.dumps({'error': error})}\n\n"
                finished = True
                break
            finish = FINISH_REASONS.get(event.finish_reason, event.finish_reason) if event.finished else None
            text = event.text
            if tools.active:  # content until a call starts, then the call as tool-call deltas
                for delta in calls.deltas(text, final=event.finished):
                    yield chunk([{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}])
                text, finish = "", tool_calls.finish_reason(finish, calls.calls > 0)
            if text or finish:
                body = {"delta": {"content": text}} if kind == "chat" else {"text": text}
                yield chunk([{"index": 0, **body, "finish_reason": finish, "logprobs": None}])
            if event.finished:
                finished = True
                if include_usage:
                    yield chunk([], openai_usage(event.usage))
        yield "data: [DONE]\n\n"
    finally:
        if not finished:  # the client went away mid-stream: stop the sequence in the engine
            transport.cancel(meta["id"])


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponse:
    try:
        await authenticate(request)
    except ApiError as exc:
        return exc.response()
    return JsonResponse({"object": "list", "data": [{"id": settings.WORKBENCH_MODEL, "object": "model",
                                                     "created": 0, "owned_by": "workbench"}]})


completions = _handler("completion")
chat_completions = _handler("chat")
