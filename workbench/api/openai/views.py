"""The OpenAI-compatible HTTP API: /v1/models, /v1/completions, /v1/chat/completions.

Same engine, same tokens as the websocket API. `stream: true` answers with server-sent events ending
in `data: [DONE]`; `stream_options.include_usage` adds a last chunk with the usage. A client that
disconnects mid-stream aborts its sequence. Errors use OpenAI's shape: {"error": {message, type,
param, code}} with a 4xx status. The prompt, the messages and the sampling values are checked by the
rules every API shares (workbench/protocol/request_input.py), with its error codes; this module maps OpenAI's
field names onto them and refuses the fields it does not serve.

The two generating endpoints are one _Serving each, as vLLM's OpenAIServingChat and
OpenAIServingCompletion are: the base answers (authenticate, check, submit the choices, reply whole or
streamed) and ChatServing and CompletionServing say where the endpoints differ (the prompt, tools,
logprobs' shape, a choice's body, the object names).
"""

from __future__ import annotations

import json
import time
import uuid

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import SamplingParams
from engine.loading.tokenizer import Tokenizer
from workbench.api.choice_streams import ChoiceGroup, choice_ids, summed_usage
from workbench.api.http_api import (ERROR_STATUS, ApiError, authenticate, check_model, json_body, refuse_unless_off,
                                    tokenizer_of, vocabulary_of)
from workbench.api.input_routes import input_route
from workbench.api.openai import params as openai_params
from workbench.api.openai import prompt_report, tool_calls
from workbench.api.openai.server_timings import llama_timings
from workbench.api.openai.logprobs_shape import CompletionLogprobs, chat_content
from workbench.api.openai.usage import openai_usage
from workbench.api.reasoning import ReasoningSplit, prompt_opens_thinking, split_whole
from workbench.protocol import request_input
from workbench.serving import bridge, input_work, limits, served_models
from workbench.serving.model_facts import if_readable, model_length
from workbench.serving.streams import StreamEvent
from workbench.serving.transport import Transport

# OpenAI request fields -> SamplingParams fields. Others are refused by name, except these, which
# clients send routinely and which change nothing here.
FIELD_MAP = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
             "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
             "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
             "repetition_penalty": "repetition_penalty", "ignore_eos": "ignore_eos",
             "stop_token_ids": "stop_token_ids", "min_tokens": "min_tokens", "response_format": "response_format"}
IGNORED = {"model", "user", "stream", "stream_options"}
# Served by OpenAI, not here: each accepted only when off (LangChain sends logit_bias: {} on every request).
OFF_ONLY: dict[str, object] = {"logit_bias": {}, "suffix": ""}
FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "canceled": "stop"}
# A failed generation's HTTP status; anything else is 500. OpenAI's clients retry 429 and 5xx by themselves.


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


class _Choice:
    """One choice of a reply: its engine sequence, and what it has sent so far."""

    def __init__(self, engine_id: str, tokenizer: Tokenizer, logprobs: bool,
                 report: prompt_report.PromptReport = prompt_report.PromptReport(), prompt_text: str = "",
                 split: ReasoningSplit | None = None) -> None:
        self.engine_id, self.tokenizer = engine_id, tokenizer
        self.text, self.last = "", StreamEvent()  # a stream always ends with its finished event
        # The logprob records, when the request asks for them (empty, not null, for a reply of no tokens)
        self.records: list[list] | None = [] if logprobs else None
        self.completion_logprobs = CompletionLogprobs(tokenizer)
        self.report, self.prompt_text = report, prompt_text  # what the reply says of its prompt (echo)
        self.prompt_records: list[list] | None = None  # StreamEvent.prompt_logprobs, from the first event
        self.echo_sent = False  # whether the echoed prompt's records went out (they lead the first logprobs)
        self.split = split  # a thinking model's reasoning and answer given apart (chat: workbench/api/reasoning.py)

    def add(self, event: StreamEvent) -> None:
        self.text += event.text
        self.last = event
        self.took(event)
        if event.logprobs is not None:
            if self.records is None:
                self.records = []
            self.records.extend(event.logprobs)

    def took(self, event: StreamEvent) -> None:
        """Keep the prompt's records the first event carries."""
        if event.prompt_logprobs is not None:
            self.prompt_records = event.prompt_logprobs


@dataclass(frozen=True)
class Prepared:
    """A checked request, ready to admit: what the engine runs and for which model."""

    tools: tool_calls.Tools
    params: SamplingParams
    n: int
    model: str
    transport: Transport
    tokenizer: Tokenizer
    prompt: str | list[int]
    report: prompt_report.PromptReport = field(default_factory=prompt_report.PromptReport)


@dataclass(frozen=True)
class Started:
    """A submitted request: its choices' streams (read them inside `async with group`) and the reply's
    id, created time and model."""

    prepared: Prepared
    group: ChoiceGroup
    choices: list[_Choice]
    meta: dict

    async def whole(self) -> tuple[str, list[int], StreamEvent]:
        """A one-choice request read to its end (the other APIs' whole replies): its text, its token ids and
        its last event, whose error_code says whether it failed. Leaving the group (the client went away,
        or the request failed) stops the sequence."""
        text, token_ids, last = "", [], None
        async with self.group:
            async for _, event in self.group:
                text, last = text + event.text, event
                token_ids += event.token_ids
                if event.error_code:
                    break
        assert last is not None  # a stream always ends with its finished event
        return text, token_ids, last


class _Serving:
    """One generating endpoint: what chat and plain completions share."""

    kind = ""  # "chat" or "completion": openai_params' and the OpenAPI document's name for the endpoint
    id_prefix = ""  # of the reply's id
    whole_object = ""  # the `object` of a whole reply
    chunk_object = ""  # the `object` of a streamed chunk
    prompt_field = ""  # what an engine refusal of the prompt names as its `param`
    defaults: dict[str, object] = {}  # SamplingParams values the body may override
    off_only = OFF_ONLY  # the fields accepted only when off

    def accepted_fields(self) -> set[str]:
        """Every field the endpoint takes (the OpenAPI document lists the same: workbench/api/openai/openapi.py)."""
        return set(FIELD_MAP) | IGNORED | set(self.off_only) | openai_params.endpoint_fields(self.kind)

    def tools(self, body: dict) -> tool_calls.Tools:
        return tool_calls.Tools((), "none")

    def prompt(self, body: dict, tokenizer: Tokenizer, tools: tool_calls.Tools) -> str | list[int]:
        raise NotImplementedError

    def logprobs(self, choice: _Choice, records: list[list] | None) -> dict | None:
        """OpenAI's `logprobs` of a choice (or of a chunk's part of it), when asked for."""
        raise NotImplementedError

    def whole_choice(self, choice: _Choice, finish: str | None, tools: tool_calls.Tools) -> dict[str, object]:
        """A whole reply's choice, past its index, finish_reason and logprobs."""
        raise NotImplementedError

    def part_body(self, text: str) -> dict[str, object]:
        """A streamed chunk's choice, its text as the endpoint carries it."""
        raise NotImplementedError

    def opening_part(self, index: int, choice: _Choice) -> dict[str, object] | None:
        """A chunk of its own before choice `index`'s first part (its first event taken), or None."""
        return None

    def shown(self, choice: _Choice, event: StreamEvent) -> StreamEvent:
        """The event as the reply shows it (all of it, unless the endpoint leaves something out)."""
        return event

    def reasoning_split(self, prepared: Prepared) -> ReasoningSplit | None:
        """A new choice's reasoning splitter, where the endpoint gives a thinking model's reasoning apart."""
        return None

    def split_reasoning(self, index: int, choice: _Choice, event: StreamEvent) -> tuple[StreamEvent, list[dict]]:
        """A streamed event's answer (as the event) and the chunk parts of its reasoning, sent before it."""
        return event, []

    def reply_fields(self, choices: list[_Choice]) -> dict[str, object]:
        """Fields of a whole reply past OpenAI's (vLLM's extensions)."""
        return {}

    async def view(self, request: HttpRequest) -> HttpResponseBase:
        """Authenticate, check, then answer whole or streamed."""
        try:
            if request.method != "POST":
                raise ApiError(405, "use POST")
            user = await authenticate(request)
            body = _body(request)
            started = self.start(await self.prepare(body, len(request.body), user), user)
        except ApiError as exc:
            return exc.response()
        group, choices, meta, tools = started.group, started.choices, started.meta, started.prepared.tools
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            response = StreamingHttpResponse(self.sse(group, choices, meta, include_usage, tools),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            return response
        return await self.whole(group, choices, meta, tools)

    async def prepare(self, body: dict, size: int, user: AbstractBaseUser, check_length: bool = True) -> Prepared:
        """The body checked and turned into what the engine runs (ApiError naming what is wrong); nothing
        is admitted or submitted yet. `size`: the request's bytes, which place its work, done within
        `user`'s share of the input thread (input_work.py). `check_length`: refuse a prompt that leaves
        no room in the model's length (a route that words that refusal its own way checks it itself).
        The other APIs' routes translate their bodies into this endpoint's
        and come through here, so one set of rules checks every way in."""
        served = await served_models.served_from_loop()
        transport = await bridge.transport_from_loop()
        # The checks template, tokenize and compile grammars: a large request's run off the event loop.
        try:
            return await input_work.prepared(size, user.get_username(), self._checked, body, served, transport,
                                             check_length)
        except limits.Refused as exc:
            raise ApiError.limit(exc) from None

    def _checked(self, body: dict, served: list[str], transport: Transport, check_length: bool) -> Prepared:
        tools = self.tools(body)
        report = prompt_report.of(self.kind, body)
        params = self._params(body, tools, report)
        n = openai_params.choice_count(body)
        model = check_model(body, served)
        tokenizer = tokenizer_of(transport, model)
        prompt = self.prompt(body, tokenizer, tools)
        _fit_vocabulary(prompt, params, vocabulary_of(model))
        if check_length:
            _fit_length(prompt, tokenizer, model, self.prompt_field)
        return Prepared(tools, params, n, model, transport, tokenizer, prompt, report)

    def start(self, prepared: Prepared, user: AbstractBaseUser, keep_record: bool = True) -> Started:
        """Admit the request under `user`'s limits (ApiError when one refuses) and submit its choices, each
        under that user's prefix-cache scope (limits.Admission.submit). `keep_record`: whether their
        reproducibility records are kept for POST /v1/reproduce, which takes this reply's id; the routes
        whose replies name another id (Messages, Responses, Ollama) keep none."""
        admissions = _admit(user.get_username(), prepared.n)
        request_id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        engine_ids = choice_ids(request_id, prepared.n)
        echoed = prompt_report.prompt_text(prepared.prompt, prepared.tokenizer) if prepared.report.echo else ""
        choices = [_Choice(engine_id, prepared.tokenizer, prepared.params.logprobs is not None, prepared.report, echoed,
                           self.reasoning_split(prepared)) for engine_id in engine_ids]
        group = ChoiceGroup.submit(prepared.transport, admissions, engine_ids, prepared.prompt, prepared.params,
                                   prepared.model, keep_record)
        return Started(prepared, group, choices, {"id": request_id, "created": int(time.time()),
                                                  "model": prepared.model})

    def _params(self, body: dict, tools: tool_calls.Tools, report: prompt_report.PromptReport) -> SamplingParams:
        both = body.get("max_tokens"), body.get("max_completion_tokens")
        if None not in both and both[0] != both[1]:
            raise ApiError(400, "max_tokens and max_completion_tokens disagree; send one",
                           param="max_completion_tokens")
        values = dict(self.defaults)
        accepted = self.accepted_fields()
        for key, value in body.items():
            if key in FIELD_MAP:
                if value is not None:
                    values[FIELD_MAP[key]] = value
            elif key not in accepted:
                raise ApiError.unsupported(key)
        refuse_unless_off(body, self.off_only)
        values.update(openai_params.logprob_values(self.kind, body))
        values.update(prompt_report.engine_values(report, body))
        try:
            return tools.apply(request_input.sampling_params(values, logprobs_allowed=True,
                                                                       prompt_logprobs_allowed=True))
        except request_input.InvalidInput as exc:
            raise ApiError.refused(exc) from None

    async def whole(self, group: ChoiceGroup, choices: list[_Choice], meta: dict,
                    tools: tool_calls.Tools) -> HttpResponse:
        # Leaving the group (the client went away, or a choice failed) stops the sequences still running.
        async with group:
            async for index, event in group:
                choices[index].add(self.shown(choices[index], event))
                if event.error_code:  # one failed choice fails the reply: the others need not run on
                    break
        for choice in choices:
            event = choice.last
            if event.error_code:
                status = ERROR_STATUS.get(event.error_code, 500)
                # The engine refuses only prompts (empty, too long, a token id past the vocabulary) this way.
                param = self.prompt_field if event.error_code == "invalid_request" else None
                return ApiError(status, event.error or "", code=event.error_code, param=param,
                                kind="invalid_request_error" if status == 400 else "server_error").response()
        shaped = []
        for index, choice in enumerate(choices):
            finish = FINISH_REASONS.get(choice.last.finish_reason or "", choice.last.finish_reason)
            one: dict[str, object] = {"index": index, "finish_reason": finish,
                                      "logprobs": self.logprobs(choice, choice.records)}
            shaped.append({**one, **self.whole_choice(choice, finish, tools)})
        usage = openai_usage(summed_usage([choice.last.usage for choice in choices]))
        timings = llama_timings(choices[0].last.usage, choices[0].last.timings)  # llama.cpp serves one choice
        return JsonResponse({**meta, "object": self.whole_object, "choices": shaped, "usage": usage,
                             **({"timings": timings} if timings else {}), **self.reply_fields(choices)})

    async def sse(self, group: ChoiceGroup, choices: list[_Choice], meta: dict, include_usage: bool,
                  tools: tool_calls.Tools) -> AsyncIterator[str]:
        writer = _ChunkWriter(self, choices, meta, include_usage)
        calls = [tool_calls.CallStream(tools) for _ in choices]  # each choice makes its own calls
        # Leaving the group (the client went away mid-stream, or a choice failed) stops the sequences
        # still running.
        opened: set[int] = set()
        async with group:
            async for index, event in group:
                event = self.shown(choices[index], event)
                choices[index].took(event)
                # A choice opens with its first tokens, not before its prompt is prefilled (as vLLM does): a
                # client's time to its first chunk is then its time to the first token.
                if index not in opened and (opening := self.opening_part(index, choices[index])) is not None:
                    yield writer.chunk([opening])
                opened.add(index)
                event, reasoning_parts = self.split_reasoning(index, choices[index], event)
                for reasoning_part in reasoning_parts:
                    yield writer.chunk([reasoning_part])
                choices[index].last = event  # a stream sends each part as it comes: no whole text is kept
                if event.error_code:
                    if event.text or event.logprobs:  # what came before the failure (a stream interval holds it back)
                        yield writer.chunk([writer.part(index, event, None)])
                    error = {"message": event.error, "type": "server_error", "code": event.error_code}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    break
                for text in writer.content(index, event, tools, calls[index]):
                    yield text
            else:
                if include_usage:
                    yield writer.chunk([], openai_usage(summed_usage([choice.last.usage for choice in choices])))
            yield "data: [DONE]\n\n"


class _ChunkWriter:
    """One streamed reply's SSE chunks: the endpoint's chunk object around each choice's parts."""

    def __init__(self, serving: _Serving, choices: list[_Choice], meta: dict, include_usage: bool) -> None:
        self.serving, self.choices, self.meta, self.include_usage = serving, choices, meta, include_usage

    def chunk(self, parts: list[dict], usage: dict | None = None, timings: dict | None = None) -> str:
        payload = {**self.meta, "object": self.serving.chunk_object, "choices": parts}
        if self.include_usage:
            payload["usage"] = usage
        if timings is not None:  # a choice's last chunk: llama.cpp's timings (server_timings.py)
            payload["timings"] = timings
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def part(self, index: int, event: StreamEvent, finish: str | None, text: str | None = None) -> dict:
        return {"index": index, **self.serving.part_body(event.text if text is None else text), "finish_reason": finish,
                "logprobs": self.serving.logprobs(self.choices[index], event.logprobs)}

    def content(self, index: int, event: StreamEvent, tools: tool_calls.Tools,
                calls: tool_calls.CallStream) -> Iterator[str]:
        """An event's text (or, with tools, content until a call starts, then the call as tool-call
        deltas), its logprobs and, on the choice's last, its finish reason and timings."""
        finish = FINISH_REASONS.get(event.finish_reason or "", event.finish_reason) if event.finished else None
        timings = llama_timings(event.usage, event.timings) if finish else None
        if tools.active:
            for delta in calls.deltas(event.text, final=event.finished, finish=finish):
                yield self.chunk([{"index": index, "delta": delta, "finish_reason": None, "logprobs": None}])
            finish = tool_calls.finish_reason(finish, calls.calls > 0) if finish else None
            if finish or event.logprobs:
                yield self.chunk([self.part(index, event, finish, text="")], timings=timings)
        # A delta whose text is held back (half a character, a stop string's start) still sends its
        # tokens' logprobs, so that a stream carries every value the whole reply does.
        elif event.text or finish or event.logprobs:
            yield self.chunk([self.part(index, event, finish)], timings=timings)


class ChatServing(_Serving):
    """/v1/chat/completions: messages through the chat template, tools, content logprobs."""

    kind, id_prefix, whole_object, chunk_object = "chat", "chatcmpl", "chat.completion", "chat.completion.chunk"
    prompt_field = "messages"
    off_only = {**OFF_ONLY, "echo": False}  # echo is served on /v1/completions only (prompt_report.py)
    # Without max_tokens a chat reply may run to the end of the model's context, as in vLLM.
    defaults = {"max_tokens": None}

    def accepted_fields(self) -> set[str]:
        return super().accepted_fields() | set(tool_calls.FIELDS)

    def tools(self, body: dict) -> tool_calls.Tools:
        try:
            return tool_calls.tools_of(body)
        except request_input.InvalidInput as exc:
            raise ApiError.refused(exc) from None

    def prompt(self, body: dict, tokenizer: Tokenizer, tools: tool_calls.Tools) -> str | list[int]:
        try:
            messages, shown = tool_calls.messages_for(body.get("messages"), tools, tokenizer.takes_tools)
            return request_input.chat_prompt(tokenizer, messages, tools=shown)
        except request_input.InvalidInput as exc:
            raise ApiError.refused(exc) from None

    def logprobs(self, choice: _Choice, records: list[list] | None) -> dict | None:
        return None if records is None else {"content": chat_content(choice.tokenizer, records)}

    def whole_choice(self, choice: _Choice, finish: str | None, tools: tool_calls.Tools) -> dict[str, object]:
        text, reasoning = choice.text, None
        if choice.split is not None:
            reasoning, text = split_whole(choice.text, choice.split.opened)
        content, calls = tool_calls.parse(text, tools)
        reason = tool_calls.finish_reason(finish, bool(calls))
        if reason == "length" and not calls and (cut := tool_calls.cut(text, tools)) is not None:
            content, calls = None, [cut]  # a forced call max_tokens ended: its arguments so far, still "length"
        thought = {} if reasoning is None else {"reasoning_content": reasoning}
        return {"finish_reason": reason, "message": {"role": "assistant", "content": content, **thought,
                                                     **({"tool_calls": calls} if calls else {})}}

    def reasoning_split(self, prepared: Prepared) -> ReasoningSplit | None:
        tokenizer = prepared.tokenizer
        if not tokenizer.thinks or not isinstance(prepared.prompt, list):
            return None
        tail = tokenizer.decode(prepared.prompt[-8:], skip_special_tokens=False)
        return ReasoningSplit(prompt_opens_thinking(tail))

    def split_reasoning(self, index: int, choice: _Choice, event: StreamEvent) -> tuple[StreamEvent, list[dict]]:
        if choice.split is None:
            return event, []
        reasoning, answer = choice.split.feed(event.text, final=event.finished)
        parts = [{"index": index, "delta": {"reasoning_content": reasoning}, "finish_reason": None,
                  "logprobs": None}] if reasoning else []
        return replace(event, text=answer), parts

    def part_body(self, text: str) -> dict[str, object]:
        return {"delta": {"content": text}}

    def opening_part(self, index: int, choice: _Choice) -> dict[str, object] | None:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}

    def reply_fields(self, choices: list[_Choice]) -> dict[str, object]:
        records, top = choices[0].prompt_records, choices[0].report.prompt_logprobs
        if records is None or top is None:
            return {}
        return {"prompt_logprobs": prompt_report.vllm_prompt_logprobs(choices[0].tokenizer, records, top)}


class CompletionServing(_Serving):
    """/v1/completions: a prompt as text or token ids, no tools, completion logprobs."""

    kind, id_prefix, whole_object, chunk_object = "completion", "cmpl", "text_completion", "text_completion"
    prompt_field = "prompt"
    defaults: dict[str, object] = {}  # a plain completion keeps OpenAI's default of 16 tokens

    def prompt(self, body: dict, tokenizer: Tokenizer, tools: tool_calls.Tools) -> str | list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # OpenAI accepts a list of prompts (texts or token-id lists); one is served
        try:
            return request_input.prompt(prompt)
        except request_input.InvalidInput as exc:
            raise ApiError.refused(exc) from None

    def logprobs(self, choice: _Choice, records: list[list] | None) -> dict | None:
        return None if records is None else choice.completion_logprobs.part(self._echoed(choice) + records)

    def _echoed(self, choice: _Choice) -> list[list]:
        """The prompt's records once, ahead of the first logprobs of a choice that echoes them."""
        records, report = choice.prompt_records, choice.report
        if choice.echo_sent or not report.echo or report.logprobs is None or records is None:
            return []
        choice.echo_sent = True
        return prompt_report.echoed_records(records, report.logprobs)

    def whole_choice(self, choice: _Choice, finish: str | None, tools: tool_calls.Tools) -> dict[str, object]:
        extra: dict[str, object] = {}
        if choice.report.prompt_logprobs is not None and choice.prompt_records is not None:
            extra["prompt_logprobs"] = prompt_report.vllm_prompt_logprobs(choice.tokenizer, choice.prompt_records,
                                                                          choice.report.prompt_logprobs)
        return {"text": choice.prompt_text + choice.text, **extra}

    def opening_part(self, index: int, choice: _Choice) -> dict[str, object] | None:
        """An echoing choice's prompt, with its logprobs when asked, ahead of the completion (as vLLM streams it)."""
        if not choice.report.echo:
            return None
        records: list[list] | None = None if choice.records is None else []
        return {"index": index, "text": choice.prompt_text, "finish_reason": None,
                "logprobs": self.logprobs(choice, records)}

    def shown(self, choice: _Choice, event: StreamEvent) -> StreamEvent:
        """Scoring alone (echo, max_tokens 0): the one token the engine generated is left out."""
        if not choice.report.scoring_only:
            return event
        usage = event.usage and {**event.usage, "completion_tokens": 0, "total_tokens": event.usage["prompt_tokens"]}
        return replace(event, text="", token_ids=[], logprobs=None if event.logprobs is None else [], usage=usage,
                       finish_reason="length" if event.finished and not event.error_code else event.finish_reason)

    def part_body(self, text: str) -> dict[str, object]:
        return {"text": text}


SERVINGS: dict[str, _Serving] = {"chat": ChatServing(), "completion": CompletionServing()}


def accepted_fields(kind: str) -> set[str]:
    """Every field the endpoint `kind` ("chat" or "completion") takes."""
    return SERVINGS[kind].accepted_fields()


def _fit_vocabulary(prompt: str | list[int], params: SamplingParams, vocabulary: int) -> None:
    try:
        request_input.fit_vocabulary(prompt, params, vocabulary)
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


def _fit_length(prompt: str | list[int], tokenizer: Tokenizer, model: str, param: str) -> None:
    count = len(prompt) if isinstance(prompt, list) else len(tokenizer.encode(prompt))
    try:
        request_input.fit_length(count, model_length(model), param)
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


def _admit(user: str, n: int) -> list[limits.Admission]:
    """One admission per choice (each is an engine sequence, so each counts toward the limits); all or none."""
    try:
        return limits.admit_all(user, n)
    except limits.Refused as exc:
        raise ApiError.limit(exc) from None


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponse:
    try:
        await authenticate(request)
    except ApiError as exc:
        return exc.response()
    served = await served_models.served_from_loop()
    return JsonResponse({"object": "list", "data": [_model_object(name) for name in served]})


@csrf_exempt  # a DELETE (the SDK's models.delete) gets the 405 below, not the CSRF check's HTML 403
async def model(request: HttpRequest, model_id: str) -> HttpResponse:
    """GET /v1/models/{id}: one served model, or 404 as for a request naming a model not served."""
    try:
        if request.method != "GET":
            raise ApiError(405, "use GET")
        await authenticate(request)
        check_model({"model": model_id}, await served_models.served_from_loop())
    except ApiError as exc:
        return exc.response()
    return JsonResponse(_model_object(model_id))


def _model_object(name: str) -> dict[str, object]:
    # max_model_len and root as vLLM adds them: clients written for vLLM read the context length there.
    length = if_readable(model_length, name)  # a Celery web process may not hold every worker's model files
    return {"id": name, "object": "model", "created": 0, "owned_by": "workbench", "root": name,
            **({"max_model_len": length} if length is not None else {})}


completions = input_route("openai")(csrf_exempt(SERVINGS["completion"].view))
chat_completions = input_route("openai")(csrf_exempt(SERVINGS["chat"].view))
