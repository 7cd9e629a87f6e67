"""The websocket API, /ws/v1/generate: several generations multiplexed on one socket (docs/PROTOCOL.md).

Thin on purpose: its frames are checked by workbench/api/frames.py, the request goes to the serving
bridge, and its stream is relayed. Every bad frame gets an `error` frame (workbench/protocol/json_socket.py)
and changes nothing else: the socket and every other request on it keep working. A token revoked (or
its user deactivated) while the socket is open gets its next frame refused and the socket closed
(workbench/protocol/socket_access.py), which cancels its running requests (`disconnect`); a socket that
only listens keeps its running requests until they end.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from engine.loading.tokenizer import Tokenizer
from workbench.api import frames
from workbench.api.choice_streams import ChoiceGroup, choice_ids, summed_usage
from workbench.api.models import ApiToken
from workbench.api.openai.logprobs_shape import socket_logprobs
from workbench.protocol.json_socket import FrameError, JsonSocketConsumer
from workbench.protocol.model_choice import model_of
from workbench.serving import bridge, input_work, limits, served_models
from workbench.serving.streams import RequestStream, StreamEvent


class GenerateConsumer(JsonSocketConsumer):
    error_echo = "request_id"

    def token_holder(self, token: str) -> Any:
        return ApiToken.user_for(token)  # programs open this socket with their API tokens

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
        self.engine_ids: dict[str, list[str]] = {}  # one per choice
        self.submitted = 0
        if self.door is not None:  # large frames read on the input thread: refused unread once the share is spent
            self.door.share_user = user.get_username()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for request_id in list(getattr(self, "active", {})):
            self._cancel(request_id)
            self.active.pop(request_id).cancel()

    def echo_of(self, refused: dict[str, object] | None) -> str | None:
        return frames.request_id_of(refused)

    async def receive_json(self, content: dict[str, object], **kwargs: object) -> None:
        if frames.kind(content) == "generate":
            await self._generate(content)
        else:
            self._cancel(frames.cancelled_request_id(content, self.active))

    def _cancel(self, request_id: str) -> None:
        for engine_id in self.engine_ids[request_id]:
            bridge.transport().cancel(engine_id)

    async def _generate(self, frame: dict[str, object]) -> None:
        request_id = frames.new_request_id(frame, self.active)
        model = model_of(frame, await served_models.served_from_loop(), request_id)
        transport = await bridge.transport_from_loop()
        try:
            tokenizer = served_models.tokenizer_of(transport, model)
            vocabulary = served_models.vocabulary_of(model)
        except served_models.TokenizerUnreadable as exc:
            raise FrameError("unavailable", exc.message, request_id) from None
        user = self.scope["user"]
        assert user is not None  # connect refused a socket without a signed-in user
        try:
            prompt, params, n = await input_work.prepared(self.frame_bytes, user.username, frames.generation, frame,
                                                          tokenizer, request_id, vocabulary)
            self.submitted += 1
            engine_ids = choice_ids(f"ws-{self.socket_id}-{self.submitted}-{request_id}", n or 1)
            admissions = limits.admit_all(user.username, n or 1)
        except limits.Refused as exc:
            raise FrameError(exc.code, exc.message, request_id, exc.retry_after) from None
        # No record kept: a websocket reply names no id that POST /v1/reproduce could take.
        choices = ChoiceGroup.submit(transport, admissions, engine_ids, prompt, params, model, keep_record=False)
        self.engine_ids[request_id] = engine_ids
        relay = self._relay(request_id, choices.streams[0], tokenizer) if n is None else \
            self._relay_choices(request_id, choices, tokenizer)
        self.active[request_id] = asyncio.create_task(relay)
        await self.send_json({"type": "accepted", "request_id": request_id})

    async def _relay(self, request_id: str, stream: RequestStream, tokenizer: Tokenizer) -> None:
        """A request of one choice (no `n` sent): its frames as they always were, without `choice`."""
        try:
            async for event in stream:
                if event.finished:
                    self._forget(request_id)
                await self._send_event(request_id, event, tokenizer, {}, event.usage)
        finally:
            self._forget(request_id)

    async def _relay_choices(self, request_id: str, choices: ChoiceGroup, tokenizer: Tokenizer) -> None:
        """A request sent with `n`: each frame names its `choice`; each choice ends with its own `done`, and
        the last of them (the request's end) alone carries the usage, the prompt counted once. One choice
        that fails ends the request with its `error` and stops the others, as on the OpenAI API."""
        left = len(choices.streams)
        usages: list[dict | None] = [None] * left
        try:
            async with choices:
                async for index, event in choices:
                    if event.finished:
                        usages[index], left = event.usage, left - 1
                    if event.error_code or (event.finished and not left):
                        self._forget(request_id)
                    usage = summed_usage(usages) if event.finished and not left else None
                    await self._send_event(request_id, event, tokenizer, {"choice": index}, usage)
                    if event.error_code:
                        break
        finally:
            self._forget(request_id)

    async def _send_event(self, request_id: str, event: StreamEvent, tokenizer: Tokenizer, choice: dict[str, int],
                          usage: dict | None) -> None:
        if event.text or event.token_ids:
            delta = {"type": "delta", "request_id": request_id, **choice, "index": event.index,
                     "text": event.text, "token_ids": event.token_ids}
            if event.logprobs is not None:  # one per token of token_ids, when the request asks
                delta["logprobs"] = socket_logprobs(tokenizer, event.logprobs)
            await self.send_json(delta)
        if event.finished and event.error_code:
            await self.send_error(event.error_code, event.error or "", request_id)
        elif event.finished:
            await self.send_json({"type": "done", "request_id": request_id, **choice,
                                  "finish_reason": event.finish_reason, "usage": usage, "timings": event.timings})

    def _forget(self, request_id: str) -> None:
        """Frees a request's id, from its relay task. Called before the request's last frame goes out, so a
        client that reuses the id as soon as it hears `done` (or `error`) is not told it still runs; and
        never frees the id again once a newer request on this socket has taken it."""
        if self.active.get(request_id) is asyncio.current_task():
            del self.active[request_id]
            self.engine_ids.pop(request_id, None)
