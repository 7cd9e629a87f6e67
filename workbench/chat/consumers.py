"""The chat page's websocket, /ws/chat/<id>: send, stop, regenerate and edit for one conversation.

Only the conversation's owner connects (anyone else is refused before accept). The user's message is
stored before generation starts; the reply is stored when it ends, also when stopped (with the partial
text and finish_reason "canceled") or when it fails ("error").
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError
from django.utils import timezone

from engine import InvalidSamplingParams, SamplingParams
from engine.tokenizer import TokenizerError
from workbench.api.json_input import JsonInputError, parse_object
from workbench.chat.fitting import fitted_prompt
from workbench.chat.models import Conversation, Message
from workbench.serving import bridge

MAX_MESSAGE_CHARS = 20_000


class ReplyUnderWay(Exception):
    """Another reply to this conversation is being generated (any tab, any web process)."""


class ChatConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        conversation = await self._conversation()
        if conversation is None:
            await self.close(code=4404)
            return
        self.conversation: Conversation = conversation
        self.generation: asyncio.Task | None = None
        self.engine_id: str | None = None
        self.stop_asked = False  # a stop (or close) before the request reached the transport
        await self.accept()

    @database_sync_to_async
    def _conversation(self) -> Conversation | None:
        user = self.scope.get("user")
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        return Conversation.owned_by(user).filter(pk=conversation_id).first() if user else None

    async def disconnect(self, code) -> None:
        generation = getattr(self, "generation", None)  # unset when connect refused the socket
        if generation is not None and not generation.done():
            self._stop()

    def _stop(self) -> None:
        self.stop_asked = True  # seen by _answer if its request is not submitted yet
        transport = bridge.running()  # never start (block on) a transport just to stop
        if self.engine_id and transport is not None:
            transport.cancel(self.engine_id)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            frame = parse_object(text_data or "")
        except JsonInputError as exc:
            await self._error("invalid_frame", exc.message)
            return
        kind = frame.get("type")
        if kind == "stop":
            if self.generation and not self.generation.done():
                self._stop()
            return
        if kind not in ("send", "regenerate", "edit"):
            await self._error("unknown_type", f"unknown frame type {kind!r}")
            return
        if self.generation and not self.generation.done():
            await self._error("busy", "a reply is still being generated; stop it first")
            return
        if not await self._still_signed_in():
            await self._error("signed_out", "you signed out (in this or another tab); sign in again")
            await self.close(code=4401)
            return
        try:
            # No max_tokens from the page: the reply may run to the end of the model's context.
            params = SamplingParams.from_dict({"max_tokens": None, **(frame.get("params") or {})})
        except (InvalidSamplingParams, TypeError) as exc:
            await self._error("invalid_params", str(exc))
            return
        content = frame.get("content")
        if kind in ("send", "edit") and (not isinstance(content, str) or not content.strip()
                                         or len(content) > MAX_MESSAGE_CHARS):
            await self._error("invalid_request", f"content must be 1-{MAX_MESSAGE_CHARS} characters of text")
            return
        try:
            prepared = await self._prepare(kind, content)
        except ReplyUnderWay:
            await self._error("busy", "a reply to this conversation is being generated (in another tab?); "
                                      "wait for it or stop it there")
            return
        except Conversation.DoesNotExist:
            await self._gone()
            return
        except DatabaseError:
            if await self._exists():
                raise
            await self._gone()
            return
        if prepared is None:
            await self._error("invalid_request", "nothing to regenerate or edit yet")
            return
        # The id and the stop flag are this request's before the task runs: a stop that comes while the
        # transport is still starting (the first request after a restart) must reach it.
        self.engine_id, self.stop_asked = f"chat-{self.conversation.pk}-{uuid.uuid4().hex}", False
        self.generation = asyncio.create_task(self._generate(*prepared, params))

    @database_sync_to_async
    def _prepare(self, kind: str, content: str | None) -> tuple[list[dict], datetime] | None:
        """Claim the conversation for a reply and apply the user's action to it; returns the history to
        answer with the claim, None if there is nothing to answer. ReplyUnderWay if a reply is under way
        (any tab); the claim is released unless a reply is to follow."""
        claim = self.conversation.claim_reply()
        if claim is None:
            raise ReplyUnderWay
        history = None
        try:
            history = self._apply(kind, content)
        finally:
            if history is None:
                self.conversation.release_reply(claim)
        return None if history is None else (history, claim)

    def _apply(self, kind: str, content: str | None) -> list[dict] | None:
        conversation = self.conversation
        messages = list(conversation.messages.all())
        if kind == "send":
            assert content is not None  # receive refuses a send without content
            Message.objects.create(conversation=conversation, role="user", content=content)
            if conversation.title == "New conversation":
                conversation.title = content.strip().splitlines()[0][:60]
        else:
            last_user = next((m for m in reversed(messages) if m.role == "user"), None)
            if last_user is None:
                return None
            # Drop the replies to the last user message; "edit" also replaces its text.
            conversation.messages.filter(created_at__gte=last_user.created_at, role="assistant").delete()
            if kind == "edit":
                assert content is not None  # as for send
                last_user.content = content
                last_user.save(update_fields=["content"])
        conversation.updated_at = timezone.now()
        conversation.save(update_fields=["title", "updated_at"])
        return conversation.history()

    async def _generate(self, history: list[dict], claim: datetime, params: SamplingParams) -> None:
        try:
            await self._answer(history, params)
        finally:
            await database_sync_to_async(self.conversation.release_reply)(claim)

    async def _answer(self, history: list[dict], params: SamplingParams) -> None:
        transport = await bridge.transport_from_loop()
        try:
            prompt = await asyncio.to_thread(fitted_prompt, transport.tokenizer, history)  # long ones take a while
        except TokenizerError as exc:
            await self._error("invalid_request", str(exc))
            return
        await self._send({"type": "started"})
        text, event = "", None
        user = self.scope["user"]
        assert user is not None  # _conversation refused a socket without one
        stream = transport.submit(self.engine_id, prompt, params, user=user.username)
        if self.stop_asked:
            transport.cancel(self.engine_id)
        async for event in stream:
            if event.text:
                text += event.text
                await self._send({"type": "delta", "index": event.index, "text": event.text})
        assert event is not None  # a stream ends with its finished event
        try:
            message = await self._store_reply(text, event)
        except DatabaseError:
            if await self._exists():
                raise
            await self._gone()  # deleted while it was answered
            return
        await self._send({"type": "done", "message_id": message.pk, "finish_reason": event.finish_reason,
                          "error": event.error, "usage": event.usage, "timings": event.timings})

    @database_sync_to_async
    def _still_signed_in(self) -> bool:
        """False once the session this socket was opened with is gone: logging out (in any tab) deletes
        it, and a socket opened before must not go on generating in the user's name. (A socket without
        a session key was not opened by a session.)"""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        return session is None or key is None or session.exists(key)

    @database_sync_to_async
    def _exists(self) -> bool:
        return Conversation.objects.filter(pk=self.conversation.pk).exists()

    async def _gone(self) -> None:
        await self._error("conversation_gone", "this conversation was deleted")
        await self.close(code=4404)

    @database_sync_to_async
    def _store_reply(self, text: str, event) -> Message:
        usage, timings = event.usage or {}, event.timings or {}
        return Message.objects.create(
            conversation=self.conversation, role="assistant", content=text, finish_reason=event.finish_reason or "",
            error=event.error or "", prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"), time_to_first_token=timings.get("time_to_first_token"),
            decode_tokens_per_s=timings.get("decode_tokens_per_s"))

    async def _error(self, code: str, message: str) -> None:
        await self._send({"type": "error", "code": code, "message": message})

    async def _send(self, frame: dict) -> None:
        await self.send(text_data=json.dumps(frame, ensure_ascii=False))
