"""The OpenAI-compatible HTTP API: /v1/models, /v1/completions, /v1/chat/completions.

Same engine, same tokens as the websocket API. `stream: true` answers with server-sent events ending
in `data: [DONE]`; `stream_options.include_usage` adds a last chunk with the usage. A client that
disconnects mid-stream aborts its sequence. Errors use OpenAI's shape: {"error": {message, type,
param, code}} with a 4xx status. The prompt, the messages and the sampling values are checked by the
rules every API shares (workbench/protocol/request_input.py), with its error codes; this module maps OpenAI's
field names onto them and refuses the fields it does not serve.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import SamplingParams
from engine.loading.tokenizer import Tokenizer
from workbench.api.choice_streams import choice_params, merged, summed_usage
from workbench.api.http_api import ApiError, authenticate, check_model, json_body, refuse_unless_off, tokenizer_of
from workbench.api.openai import params as openai_params
from workbench.api.openai import tool_calls
from workbench.api.openai.logprobs_shape import CompletionLogprobs, chat_content
from workbench.api.openai.usage import openai_usage
from workbench.protocol import request_input
from workbench.serving import bridge, limits, served_models
from workbench.serving.streams import StreamEvent

# OpenAI request fields -> SamplingParams fields. Others are refused by name, except these, which
# clients send routinely and which change nothing here.
FIELD_MAP = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
             "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
             "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
             "repetition_penalty": "repetition_penalty", "ignore_eos": "ignore_eos",
             "stop_token_ids": "stop_token_ids", "min_tokens": "min_tokens", "response_format": "response_format"}
IGNORED = {"model", "user", "stream", "stream_options"}
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
    if isinstance(options, dict) and set(options) - {"include_usage"}:
        raise ApiError.unsupported("stream_options", f"stream_options: only include_usage is supported, "
                                                     f"not {sorted(set(options) - {'include_usage'})}")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, "user must be a string", param="user")
    return body


def accepted_fields(kind: str) -> set[str]:
    """Every field the endpoint `kind` takes (the OpenAPI document lists the same: workbench/api/openai/openapi.py)."""
    chat_only = set(tool_calls.FIELDS) if kind == "chat" else set()
    return set(FIELD_MAP) | IGNORED | set(OFF_ONLY) | openai_params.endpoint_fields(kind) | chat_only


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
    values: dict[str, object] = {"max_tokens": None} if kind == "chat" else {}
    accepted = accepted_fields(kind)
    for key, value in body.items():
        if key in FIELD_MAP:
            if value is not None:
                values[FIELD_MAP[key]] = value
        elif key not in accepted:
            raise ApiError.unsupported(key)
    refuse_unless_off(body, OFF_ONLY)
    values.update(openai_params.logprob_values(kind, body))
    try:
        return tools.apply(request_input.sampling_params(values, logprobs_allowed=True))
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
            n = openai_params.choice_count(body)
            model = check_model(body, await served_models.served_from_loop())
            transport = await bridge.transport_from_loop()
            tokenizer = tokenizer_of(transport, model)
            prompt = _prompt(kind, body, tokenizer, tools)
            admissions = _admit(user.get_username(), n)
        except ApiError as exc:
            return exc.response()
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        # One engine sequence per choice; the first keeps the request's id, as with n=1.
        choices = [_Choice(request_id if i == 0 else f"{request_id}-{i}", tokenizer,
                           params.logprobs is not None) for i in range(n)]
        streams = [admission.submit(transport, choice.engine_id, prompt, sampling, model)
                   for admission, choice, sampling in zip(admissions, choices, choice_params(params, n))]
        meta = {"id": request_id, "created": int(time.time()), "model": model}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = StreamingHttpResponse(_sse(kind, streams, choices, transport, meta, include_usage, tools),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            return response
        return await _whole(kind, streams, choices, transport, meta, tools)

    return csrf_exempt(view)


def _admit(user: str, n: int) -> list[limits.Admission]:
    """One admission per choice (each is an engine sequence, so each counts toward the limits); all or none."""
    try:
        return limits.admit_all(user, n)
    except limits.Refused as exc:
        raise ApiError(ERROR_STATUS[exc.code], exc.message, code=exc.code,
                       kind="rate_limit_error" if exc.code == "rate_limited" else "server_error",
                       retry_after=exc.retry_after) from None


def _prompt(kind: str, body: dict, tokenizer: Tokenizer, tools: tool_calls.Tools) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # OpenAI accepts a list of prompts; one is what n=1 serves
    try:
        if kind == "chat":
            messages, shown = tool_calls.messages_for(body.get("messages"), tools, tokenizer.takes_tools)
            return request_input.chat_prompt(tokenizer, messages, tools=shown)
        return request_input.prompt(prompt)
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


class _Choice:
    """One choice of a reply: its engine sequence, and what it has sent so far."""

    def __init__(self, engine_id: str, tokenizer: Tokenizer, logprobs: bool) -> None:
        self.engine_id, self.tokenizer = engine_id, tokenizer
        self.text, self.last = "", StreamEvent()  # a stream always ends with its finished event
        # The logprob records, when the request asks for them (empty, not null, for a reply of no tokens)
        self.records: list[list] | None = [] if logprobs else None
        self.completion_logprobs = CompletionLogprobs(tokenizer)

    def add(self, event: StreamEvent) -> None:
        self.text += event.text
        self.last = event
        if event.logprobs is not None:
            if self.records is None:
                self.records = []
            self.records.extend(event.logprobs)

    def logprobs(self, kind: str, records: list[list] | None) -> dict | None:
        """OpenAI's `logprobs` of a choice (or of a chunk's part of it): None when not asked for."""
        if records is None:
            return None
        if kind == "chat":
            return {"content": chat_content(self.tokenizer, records)}
        return self.completion_logprobs.part(records)


def _cancel_unfinished(transport, choices: list[_Choice]) -> None:
    for choice in choices:
        if not choice.last.finished:
            transport.cancel(choice.engine_id)


async def _whole(kind: str, streams, choices: list[_Choice], transport, meta: dict,
                 tools: tool_calls.Tools) -> HttpResponse:
    events = merged(streams)
    try:
        async for index, event in events:
            choices[index].add(event)
            if event.error_code:  # one failed choice fails the reply: the others need not run on
                break
    finally:
        await events.aclose()
        # The client went away, or a choice failed: stop the sequences still running.
        _cancel_unfinished(transport, choices)
    for choice in choices:
        event = choice.last
        if event.error_code:
            status = ERROR_STATUS.get(event.error_code, 500)
            # The engine refuses only prompts (empty, too long, a token id past the vocabulary) this way.
            param = ("messages" if kind == "chat" else "prompt") if event.error_code == "invalid_request" else None
            return ApiError(status, event.error or "", code=event.error_code, param=param,
                            kind="invalid_request_error" if status == 400 else "server_error").response()
    shaped = []
    for index, choice in enumerate(choices):
        finish = FINISH_REASONS.get(choice.last.finish_reason or "", choice.last.finish_reason)
        one: dict[str, object] = {"index": index, "finish_reason": finish,
                                  "logprobs": choice.logprobs(kind, choice.records)}
        if kind == "chat":
            content, calls = tool_calls.parse(choice.text, tools)
            one["message"] = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            one["finish_reason"] = tool_calls.finish_reason(finish, bool(calls))
        else:
            one["text"] = choice.text
        shaped.append(one)
    obj = "chat.completion" if kind == "chat" else "text_completion"
    usage = openai_usage(summed_usage([choice.last.usage for choice in choices]))
    return JsonResponse({**meta, "object": obj, "choices": shaped, "usage": usage})


async def _sse(kind: str, streams, choices: list[_Choice], transport, meta: dict, include_usage: bool,
               tools: tool_calls.Tools):
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    calls = [tool_calls.CallStream(tools) for _ in choices]  # each choice makes its own calls

    def chunk(choices, usage=None) -> str:
        payload = {**meta, "object": obj, "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def part(index: int, event: StreamEvent, finish: str | None, text: str | None = None) -> dict:
        text = event.text if text is None else text
        body = {"delta": {"content": text}} if kind == "chat" else {"text": text}
        return {"index": index, **body, "finish_reason": finish,
                "logprobs": choices[index].logprobs(kind, event.logprobs)}

    events = merged(streams)
    try:
        if kind == "chat":
            for index in range(len(choices)):
                yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        async for index, event in events:
            choices[index].last = event  # a stream sends each part as it comes: no whole text is kept
            if event.error_code:
                if event.text or event.logprobs:  # what came before the failure (a stream interval holds it back)
                    yield chunk([part(index, event, None)])
                error = {"message": event.error, "type": "server_error", "code": event.error_code}
                yield f"data: {json.dumps({'error': error})}\n\n"
                break
            finish = FINISH_REASONS.get(event.finish_reason or "", event.finish_reason) if event.finished else None
            if tools.active:  # content until a call starts, then the call as tool-call deltas
                for delta in calls[index].deltas(event.text, final=event.finished):
                    yield chunk([{"index": index, "delta": delta, "finish_reason": None, "logprobs": None}])
                finish = tool_calls.finish_reason(finish, calls[index].calls > 0) if finish else None
                if finish or event.logprobs:
                    yield chunk([part(index, event, finish, text="")])
            # A delta whose text is held back (half a character, a stop string's start) still sends
            # its tokens' logprobs, so that a stream carries every value the whole reply does.
            elif event.text or finish or event.logprobs:
                yield chunk([part(index, event, finish)])
        else:
            if include_usage:
                yield chunk([], openai_usage(summed_usage([choice.last.usage for choice in choices])))
        yield "data: [DONE]\n\n"
    finally:
        await events.aclose()
        # The client went away mid-stream, or a choice failed: stop the sequences still running.
        _cancel_unfinished(transport, choices)


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponse:
    try:
        await authenticate(request)
    except ApiError as exc:
        return exc.response()
    served = await served_models.served_from_loop()
    return JsonResponse({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                     "owned_by": "workbench"} for name in served]})


completions = _handler("completion")
chat_completions = _handler("chat")
