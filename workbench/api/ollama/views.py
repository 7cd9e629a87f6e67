"""Ollama's native API: POST /api/chat and /api/generate (whole, or streamed as NDJSON, Ollama's default),
GET /api/tags, POST /api/show, GET /api/ps, GET /api/version.

/api/chat and /api/generate are thin translations onto the OpenAI routes' serving path: the body
becomes a chat body (or, for a raw prompt, a completions body: translate.py), which that route checks,
admits under the user's limits and submits under the user's prefix-cache scope
(workbench/api/openai/views.py: prepare and start). Every route takes our API token as
`Authorization: Bearer <token>` (Ollama's clients send it as a header they are given). Errors are
Ollama's: {"error": message} with the status.

The last record of a reply (`done: true`) carries `done_reason` (stop, length), the counts
(`prompt_eval_count`: the prompt's tokens, `eval_count`: the generated ones) and the durations in
nanoseconds: `total_duration` from the request's arrival here, `prompt_eval_duration` the engine's
time from taking the request (queue wait included) to its first token, `eval_duration` from there to
the last, `load_duration` 0 (the model is loaded before any request).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine.loading.model_card import ModelCard
from workbench.api.http_api import ApiError, authenticate, check_model, json_body
from workbench.api.input_routes import input_route
from workbench.api.ollama import translate
from workbench.api.openai import tool_calls
from workbench.api.server_views import installed_version
from workbench.api.openai.views import ERROR_STATUS, SERVINGS, Started
from workbench.serving.model_facts import embedding_length, if_readable, model_card, model_length
from workbench.serving import bridge, served_models
from workbench.serving.streams import StreamEvent


def error_response(exc: ApiError) -> JsonResponse:
    response = JsonResponse({"error": exc.message}, status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


NEVER = "9999-12-31T23:59:59Z"  # a loaded model's expiry: it stays loaded (Ollama's keep_alive -1)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _is_load(kind: str, body: dict[str, Any]) -> bool:
    """Ollama's load (or, with keep_alive 0, unload) request: a generate without a prompt, a chat without
    messages. `ollama run` and chat front ends send one before the first turn; the model is always loaded
    here, so it is answered at once."""
    if kind == "generate":
        return body.get("prompt") in (None, "")
    return body.get("messages") in (None, [])


def _load_record(kind: str, body: dict[str, Any], model: str) -> dict[str, Any]:
    reply = {"response": ""} if kind == "generate" else {"message": {"role": "assistant", "content": ""}}
    unload = body.get("keep_alive") in (0, "0", "0s")
    return {"model": model, "created_at": _now(), **reply, "done": True, "done_reason": "unload" if unload else "load"}


async def _started(request: HttpRequest, kind: str) -> tuple[Started | dict[str, Any], dict[str, Any]]:
    """The request started, or the record that answers a load request; and the body."""
    if request.method != "POST":
        raise ApiError(405, "use POST")
    user = await authenticate(request)
    body = json_body(request)
    if _is_load(kind, body):
        return _load_record(kind, body, check_model(body, await served_models.served_from_loop())), body
    raw, translated = translate.generate_body(body) if kind == "generate" else (False, translate.chat_body(body))
    serving = SERVINGS["completion" if raw else "chat"]
    try:
        prepared = await serving.prepare(translated, len(request.body), user)
    except ApiError as exc:
        raise translate.renamed(exc) from None
    return serving.start(prepared, user, keep_record=False), body


def _view(kind: str):
    @csrf_exempt
    async def view(request: HttpRequest) -> HttpResponseBase:
        arrived = time.monotonic_ns()
        try:
            started, body = await _started(request, kind)
        except ApiError as exc:
            return error_response(exc)
        if isinstance(started, dict):
            return JsonResponse(started)
        reply = _Reply(started, kind, body.get("model") or started.prepared.model, arrived)
        if body.get("stream") is not False:  # Ollama streams unless told not to (null included)
            return StreamingHttpResponse(reply.records(), content_type="application/x-ndjson")
        return await reply.whole()

    return view


class _Reply:
    def __init__(self, started: Started, kind: str, model: str, arrived: int) -> None:
        self.started, self.kind, self.model, self.arrived = started, kind, model, arrived
        self.tools = started.prepared.tools

    def record(self, text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if self.kind == "generate":
            return {"model": self.model, "created_at": _now(), "response": text, "done": False}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [{"function": {"name": c["function"]["name"],
                                                   "arguments": json.loads(c["function"]["arguments"])}} for c in calls]
        return {"model": self.model, "created_at": _now(), "message": message, "done": False}

    def last(self, event: StreamEvent, text: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        usage, timings = event.usage or {}, event.timings or {}
        first, total = timings.get("time_to_first_token") or 0.0, timings.get("total_time") or 0.0
        return {**self.record(text, calls), "done": True,
                "done_reason": "length" if event.finish_reason == "length" else "stop",
                "total_duration": time.monotonic_ns() - self.arrived, "load_duration": 0,
                "prompt_eval_count": usage.get("prompt_tokens", 0), "prompt_eval_duration": int(first * 1e9),
                "eval_count": usage.get("completion_tokens", 0), "eval_duration": int((total - first) * 1e9)}

    async def whole(self) -> JsonResponse:
        text, _, last = await self.started.whole()
        if last.error_code:
            return error_response(ApiError(ERROR_STATUS.get(last.error_code, 500), last.error or last.error_code))
        content, calls = tool_calls.parse(text, self.tools)
        return JsonResponse(self.last(last, content or "", calls))

    async def records(self) -> AsyncIterator[str]:
        stream = tool_calls.CallStream(self.tools)
        async with self.started.group:
            async for _, event in self.started.group:
                for kind, value in stream.feed(event.text) + (stream.close() if event.finished else []):
                    line = self.record(value) if kind == "content" else self.record("", [value])
                    yield json.dumps(line, ensure_ascii=False) + "\n"
                if event.error_code:
                    yield json.dumps({"error": event.error or event.error_code}) + "\n"
                    return
                if event.finished:
                    yield json.dumps(self.last(event), ensure_ascii=False) + "\n"


chat = input_route("ollama")(_view("chat"))
generate = input_route("ollama")(_view("generate"))


async def _served(request: HttpRequest, method: str) -> list[str]:
    if request.method != method:
        raise ApiError(405, f"use {method}")
    await authenticate(request)
    return await served_models.served_from_loop()


def _details(card: ModelCard | None) -> dict[str, Any]:
    if card is None:  # files this process cannot read: nothing to say
        return {"parent_model": "", "format": "", "family": "", "families": None, "parameter_size": "",
                "quantization_level": ""}
    return {"parent_model": "", "format": card.file_format, "family": card.architecture,
            "families": [card.architecture], "parameter_size": _parameter_size(card.parameter_count),
            "quantization_level": card.quantization}


def _listed(name: str) -> dict[str, Any]:
    """What /api/tags and /api/ps both say of a served model."""
    card = if_readable(model_card, name)
    return {"name": f"{name}:latest", "model": f"{name}:latest", "size": card.file_bytes if card else 0,
            "digest": "", "details": _details(card)}


def _parameter_size(count: int) -> str:
    """A parameter count as Ollama's listings show it: "134.52M", "7.2B"."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    if count >= 1_000_000:
        return f"{count / 1e6:.2f}M"
    return f"{count / 1e3:.0f}K" if count >= 1_000 else str(count)


@csrf_exempt
async def tags(request: HttpRequest) -> HttpResponseBase:
    """The served models, each under the one tag it has, `latest`."""
    try:
        served = await _served(request, "GET")
    except ApiError as exc:
        return error_response(exc)
    return JsonResponse({"models": [{**_listed(name), "modified_at": _now()} for name in served]})


@csrf_exempt
async def running(request: HttpRequest) -> HttpResponseBase:
    """GET /api/ps: the models loaded now. Every served model is (an engine loads its model before it
    serves, and keeps it), so they are the served ones, kept loaded with no expiry."""
    try:
        served = await _served(request, "GET")
    except ApiError as exc:
        return error_response(exc)
    # Ollama's clients show the share of a model in GPU memory: all of it where a worker serving it runs
    # on a GPU, none on the CPU.
    workers = (await bridge.transport_from_loop()).workers_view().values()
    on_gpu = {view["model"] for view in workers if view["device"].startswith("cuda")}
    loaded = {name: _listed(name) for name in served}
    return JsonResponse({"models": [{**model, "expires_at": NEVER, "size_vram": model["size"] if name in on_gpu else 0,
                                     "context_length": model_length(name)} for name, model in loaded.items()]})


@csrf_exempt
async def show(request: HttpRequest) -> HttpResponseBase:
    try:
        served = await _served(request, "POST")
        body = json_body(request)
        for name in body:
            if name not in ("model", "name", "verbose"):
                raise ApiError.unsupported(name)
        model = check_model({"model": translate.model_name(body.get("model") or body.get("name"))}, served)
    except ApiError as exc:
        return error_response(exc)
    card = if_readable(model_card, model)
    # Clients look the context length up under the architecture's name, as a GGUF file's keys are.
    info = {} if card is None else {
        "general.architecture": card.architecture, "general.parameter_count": card.parameter_count,
        f"{card.architecture}.context_length": model_length(model),
        f"{card.architecture}.embedding_length": embedding_length(model)}
    return JsonResponse({"modelfile": "", "parameters": "", "template": "", "details": _details(card),
                         "model_info": info,
                         "capabilities": ["completion", "tools"], "modified_at": _now()})


@csrf_exempt
async def version(request: HttpRequest) -> HttpResponseBase:
    """The workbench's version (an Ollama server answers its own)."""
    try:
        if request.method != "GET":
            raise ApiError(405, "use GET")
        await authenticate(request)
    except ApiError as exc:
        return error_response(exc)
    return JsonResponse({"version": installed_version()})
