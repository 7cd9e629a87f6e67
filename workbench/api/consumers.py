"""The websocket API, /ws/v1/generate: several generations multiplexed on one socket (docs/PROTOCOL.md).

Thin on purpose: its frames are checked by workbench/api/frames.py, the request goes to the serving
bridge, and its stream is relayed. Every bad frame gets an `error` frame (workbench/api/json_socket.py)
and changes nothing else: the socket and every other request on it keep working.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from engine.tokenizer import Tokenizer
from workbench.api import frames
from workbench.api.auth import token_still_valid
from workbench.api.json_socket import FrameError, JsonSocketConsumer
from workbench.api.logprobs_shape import socket_logprobs
from workbench.serving import bridge, limits, served_models
from workbench.serving.streams import StreamEvent


class GenerateConsumer(JsonSocketConsumer):
    error_echo = "request_id"

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.socket_id = uuid.uuid4().hex
        self.active: dict[str, asyncio.Task[None]] = {}
        # The engine's id for each active request: unique per request, not per request_id, because a
        # client reuses its ids, and a cancel that lost the race with its request's end must not reach
        # (or be remembered for) the next request under the same id.
        self.engine_ids: dict[str, str] = {}
        self.submitted = 0
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for request_id in list(getattr(self, "active", {})):
            bridge.transport().cancel(self.engine_ids[request_id])
            self.active.pop(request_id).cancel()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: object) -> None:
        # A token revoked (or its user deactivated) while the socket is open: its next frame is refused
        # and the socket closed, which cancels its running requests (docs/PROTOCOL.md). One indexed
        # lookup per frame; a socket that only listens keeps its running requests until they end.
        token = self.scope.get("bearer_token")
        if isinstance(token, str) and not await token_still_valid(token, self.scope["user"]):
            await self.send_error("token_revoked", "this socket's API token was revoked (or its user deactivated); "
                                                   "the socket closes with code 4401")
            await self.close(code=4401)
            return
        await super().receive(text_data, bytes_data, **kwargs)

    def echo_of(self, refused: dict[str, object] | None) -> str | None:
        return frames.request_id_of(refused)

    async def receive_json(self, content: dict[str, object], **kwargs: object) -> None:
        if frames.kind(content) == "generate":
            await self._generate(content)
        else:
            bridge.transport().cancel(self.engine_ids[frames.cancelled_request_id(content, self.active)])

    async def _generate(self, frame: dict[str, object]) -> None:
        request_id = frames.new_request_id(frame, self.active)
        model = frames.model(frame, await served_models.served_from_loop(), request_id)
        transport = await bridge.transport_from_loop()
        try:
            tokenizer = transport.tokenizer_for(model)
        except Exception as exc:  # its files are not where the workers' WORKBENCH_MODEL names them
            raise FrameError("unavailable", f"this server cannot read the tokenizer of {model!r}: {exc}",
                             request_id) from None
        prompt, params = frames.generation(frame, tokenizer, request_id)
        self.submitted += 1
        engine_id = f"ws-{self.socket_id}-{self.submitted}-{request_id}"
        user = self.scope["user"]
        assert user is not None  # connect refused a socket without a signed-in user
        try:
            admission = limits.admit(user.username)
        except limits.Refused as exc:
            raise FrameError(exc.code, exc.message, request_id, exc.retry_after) from None
        stream = admission.submit(transport, engine_id, prompt, params, model)
        self.engine_ids[request_id] = engine_id
        self.active[request_id] = asyncio.create_task(self._relay(request_id, stream, tokenizer))
        await self.send_json({"type": "accepted", "request_id": request_id})

    async def _relay(self, request_id: str, stream: AsyncIterator[StreamEvent], tokenizer: Tokenizer) -> None:
        try:
            async for event in stream:
                if event.text or event.token_ids:
                    delta = {"type": "delta", "request_id": request_id, "index": event.index,
                             "text": event.text, "token_ids": event.token_ids}
                    if event.logprobs is not None:  # one per token of token_ids, when the request asks
                        delta["logprobs"] = socket_logprobs(tokenizer, event.logprobs)
                    await self.send_json(delta)
                if event.finished and event.error_code:
                    await self.send_error(event.error_code, event.error or "", request_id)
                elif event.finished:
                    await self.send_json({"type": "done", "request_id": request_id,
                                          "finish_reason": event.finish_reason, "usage": event.usage,
                                          "timings": event.timings})
        finally:
            self.active.pop(request_id, None)
            self.engine_ids.pop(request_id, None)
