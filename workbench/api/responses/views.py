"""OpenAI's Responses API: POST /v1/responses (whole, or streamed as its server-sent events), GET and
DELETE /v1/responses/{id}.

A thin translation onto the chat-completions route's serving path: the body becomes a chat body
(translate.py), which the chat route checks, admits under the user's limits and submits under the
user's prefix-cache scope (workbench/api/openai/views.py: ChatServing.prepare and start); the output
items are built here (output.py). Authenticated and answered in errors as /v1 is (http_api.py).

`store` (OpenAI's default: true) keeps the reply for its user (store.py), for the retention period:
GET /v1/responses/{id} reads it back, DELETE deletes it, and `previous_response_id` continues its
conversation; another user's id is a 404.

A stream: response.created, response.in_progress, the items' events (output.py), then
response.completed (or response.incomplete when max_output_tokens ended it); every event carries its
`sequence_number`. A failure after the stream began is an `error` event, as OpenAI sends one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from workbench.api.http_api import ApiError, authenticate, json_body
from workbench.api.input_routes import input_route
from workbench.api.openai.views import ERROR_STATUS, SERVINGS, Started
from workbench.api.responses import store, translate
from workbench.api.responses.output import Output
from workbench.serving.streams import StreamEvent


@input_route("openai")
@csrf_exempt
async def responses(request: HttpRequest) -> HttpResponseBase:
    try:
        if request.method != "POST":
            raise ApiError(405, "use POST")
        user = await authenticate(request)
        body = json_body(request)
        previous = translate.check(body)
        messages = translate.conversation(body, await store.conversation_of(user, previous))
        chat, namespaced = translate.chat_body(body, messages)
        try:
            prepared = await SERVINGS["chat"].prepare(chat, len(request.body), user)
        except ApiError as exc:
            raise translate.renamed(exc) from None
        started = SERVINGS["chat"].start(prepared, user, keep_record=False)
    except ApiError as exc:
        return exc.response()
    reply = _Reply(started, body, messages, user, namespaced)
    if body.get("stream"):
        response = StreamingHttpResponse(reply.events(), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        return response
    return await reply.whole()


@csrf_exempt
async def response(request: HttpRequest, response_id: str) -> HttpResponseBase:
    """GET /v1/responses/{id}: a stored reply, its own user's only; DELETE: delete it."""
    try:
        if request.method not in ("GET", "DELETE"):
            raise ApiError(405, "use GET or DELETE")
        user = await authenticate(request)
        if request.method == "DELETE":
            return JsonResponse(await store.delete(user, response_id))
        return JsonResponse(await store.response_of(user, response_id))
    except ApiError as exc:
        return exc.response()


class _Reply:
    """One request's reply: its Response object, whole or as the stream's events, and its storing."""

    def __init__(self, started: Started, body: dict[str, Any], messages: list[dict[str, Any]],
                 user: AbstractBaseUser, namespaced: dict[str, tuple[str, str]]) -> None:
        self.started, self.body, self.messages, self.user = started, body, messages, user
        self.output = Output(started.prepared.tools, started.choices[0].split, namespaced)
        self.id = "resp_" + started.meta["id"].split("-", 1)[1]

    def shaped(self, status: str, last: StreamEvent | None = None) -> dict[str, Any]:
        """The Response object, as it stands."""
        body, usage = self.body, last.usage if last is not None else None
        return {"id": self.id, "object": "response", "created_at": self.started.meta["created"], "status": status,
                "model": self.started.prepared.model, "output": self.output.items, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
                "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
                "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "text": body.get("text") or {"format": {"type": "text"}},
                "previous_response_id": body.get("previous_response_id"), "store": self.storing,
                "metadata": body.get("metadata") or {}, "user": body.get("user"), "truncation": "disabled",
                "reasoning": body.get("reasoning"), "usage": _usage(usage)}

    @property
    def storing(self) -> bool:
        return self.body.get("store") is not False

    async def finished(self, last: StreamEvent) -> dict[str, Any]:
        """The finished Response object, stored when asked."""
        shaped = self.shaped("incomplete" if last.finish_reason == "length" else "completed", last)
        if self.storing:
            await store.save(self.user, shaped, self.messages + self.output.messages())
        return shaped

    async def whole(self) -> JsonResponse:
        text, _, last = await self.started.whole()
        if last.error_code:
            status = ERROR_STATUS.get(last.error_code, 500)
            return ApiError(status, last.error or "", code=last.error_code,
                            kind="invalid_request_error" if status == 400 else "server_error").response()
        self.output.feed(text, final=True)
        return JsonResponse(await self.finished(last))

    async def events(self) -> AsyncIterator[str]:
        number = 0

        def sse(event: dict[str, Any]) -> str:
            nonlocal number
            event = {**event, "sequence_number": number}
            number += 1
            return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

        # Leaving the group (the client went away mid-stream, even before the first event, or the request
        # failed) stops the sequence: so every yield is inside it.
        async with self.started.group:
            yield sse({"type": "response.created", "response": self.shaped("in_progress")})
            yield sse({"type": "response.in_progress", "response": self.shaped("in_progress")})
            async for _, event in self.started.group:
                for item_event in self.output.feed(event.text, final=event.finished):
                    yield sse(item_event)
                if event.error_code:
                    yield sse({"type": "error", "code": event.error_code, "message": event.error, "param": None})
                    return
                if event.finished:
                    shaped = await self.finished(event)
                    yield sse({"type": f"response.{shaped['status']}", "response": shaped})


def _usage(usage: dict | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
