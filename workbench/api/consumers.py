"""The websocket API, /ws/v1/generate: several generations multiplexed on one socket (docs/PROTOCOL.md).

Thin on purpose: parse and check a frame, hand the request to the serving bridge, relay its stream.
Every bad frame gets an `error` frame and changes nothing else: the socket and every other request
on it keep working.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from engine import InvalidSamplingParams, SamplingParams
from engine.tokenizer import TokenizerError
from workbench.api.json_input import LONE_SURROGATE, JsonInputError, parse_object
from workbench.serving import bridge

log = logging.getLogger(__name__)

MAX_REQUEST_ID_CHARS = 128
MAX_ACTIVE_REQUESTS = 64


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id


class GenerateConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.socket_id = uuid.uuid4().hex
        self.active: dict[str, asyncio.Task] = {}
        # The engine's id for each active request: unique per request, not per request_id, because a
        # client reuses its ids, and a cancel that lost the race with its request's end must not reach
        # (or be remembered for) the next request under the same id.
        self.engine_ids: dict[str, str] = {}
        self.submitted = 0
        await self.accept()

    async def disconnect(self, code) -> None:
        for request_id in list(getattr(self, "active", {})):
            bridge.transport().cancel(self.engine_ids[request_id])
            self.active.pop(request_id).cancel()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            frame = self._parse(text_data, bytes_data)
            kind = frame.get("type")
            if kind == "generate":
                await self._generate(frame)
            elif kind == "cancel":
                self._cancel(frame)
            else:
                raise ProtocolError("unknown_type", f"unknown frame type {kind!r}; expected generate or cancel",
                                    _request_id_or_none(frame))
        except ProtocolError as exc:
            await self._send({"type": "error", "request_id": exc.request_id, "code": exc.code, "message": exc.message})
        except Exception:  # a bug costs this frame its answer, not the socket and every request on it
            log.exception("a websocket frame failed")
            await self._send({"type": "error", "request_id": None, "code": "internal_error",
                              "message": "the server failed on this frame (it is logged); the socket stays open"})

    def _parse(self, text_data, bytes_data) -> dict:
        if text_data is None:
            raise ProtocolError("invalid_frame", "frames must be JSON text, not binary")
        if len(text_data.encode()) > settings.WORKBENCH_MAX_FRAME_BYTES:
            raise ProtocolError("frame_too_large", f"frames are limited to {settings.WORKBENCH_MAX_FRAME_BYTES} bytes")
        try:
            return parse_object(text_data)
        except JsonInputError as exc:
            raise ProtocolError(exc.code, exc.message, _request_id_or_none(exc.partial)) from None

    async def _generate(self, frame: dict) -> None:
        request_id = frame.get("request_id")
        if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS:
            raise ProtocolError("invalid_request", f"request_id must be a string of 1-{MAX_REQUEST_ID_CHARS} characters",
                                _request_id_or_none(frame))
        if request_id in self.active:
            raise ProtocolError("duplicate_request_id", f"request {request_id!r} is still running on this socket",
                                request_id)
        if len(self.active) >= MAX_ACTIVE_REQUESTS:
            raise ProtocolError("too_many_requests", f"at most {MAX_ACTIVE_REQUESTS} requests per socket", request_id)
        transport = await bridge.transport_from_loop()
        prompt = self._prompt(frame, transport, request_id)
        params_raw = frame.get("params", {})
        try:
            params = SamplingParams.from_dict(params_raw)
        except (InvalidSamplingParams, TypeError) as exc:
            raise ProtocolError("invalid_params", str(exc), request_id) from None
        if params.logprobs is not None:  # the engine computes them, but deltas do not carry them (yet)
            raise ProtocolError("invalid_params", "logprobs: not sent over this API; leave it out", request_id)
        self.submitted += 1
        engine_id = self.engine_ids[request_id] = f"ws-{self.socket_id}-{self.submitted}-{request_id}"
        user = self.scope["user"]
        assert user is not None  # connect refused a socket without a signed-in user
        stream = transport.submit(engine_id, prompt, params, user=user.username)
        self.active[request_id] = asyncio.create_task(self._relay(request_id, stream))
        await self._send({"type": "accepted", "request_id": request_id})

    def _prompt(self, frame: dict, transport, request_id: str) -> str | list[int]:
        has_prompt, has_messages = "prompt" in frame, "messages" in frame
        if has_prompt == has_messages:
            raise ProtocolError("invalid_request", "send exactly one of prompt or messages", request_id)
        if has_prompt:
            prompt = frame["prompt"]
            if not isinstance(prompt, str) and not (isinstance(prompt, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
                raise ProtocolError("invalid_request", "prompt must be a string or a list of token ids", request_id)
            return prompt
        try:
            return transport.tokenizer.encode_chat(frame["messages"])
        except TokenizerError as exc:
            raise ProtocolError("invalid_request", str(exc), request_id) from None

    def _cancel(self, frame: dict) -> None:
        request_id = frame.get("request_id")
        if not isinstance(request_id, str) or request_id not in self.active:
            # Request ids are per socket: another user's (or another socket's) request is unknown here.
            raise ProtocolError("unknown_request_id", f"no running request {request_id!r} on this socket",
                                _request_id_or_none(frame))
        bridge.transport().cancel(self.engine_ids[request_id])

    async def _relay(self, request_id: str, stream) -> None:
        try:
            async for event in stream:
                if event.text or event.token_ids:
                    await self._send({"type": "delta", "request_id": request_id, "index": event.index,
                                      "text": event.text, "token_ids": event.token_ids})
                if event.finished:
                    if event.error_code:
                        await self._send({"type": "error", "request_id": request_id, "code": event.error_code,
                                          "message": event.error})
                    else:
                        await self._send({"type": "done", "request_id": request_id,
                                          "finish_reason": event.finish_reason, "usage": event.usage,
                                          "timings": event.timings})
        finally:
            self.active.pop(request_id, None)
            self.engine_ids.pop(request_id, None)

    async def _send(self, frame: dict) -> None:
        await self.send(text_data=json.dumps(frame, ensure_ascii=False))


def _request_id_or_none(frame) -> str | None:
    request_id = frame.get("request_id") if isinstance(frame, dict) else None
    return request_id if isinstance(request_id, str) and not LONE_SURROGATE.search(request_id) else None
