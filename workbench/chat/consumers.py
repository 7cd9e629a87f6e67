"""The chat page's websocket, /ws/chat/<id>: send, stop, regenerate and edit for one conversation.

Only the conversation's owner connects (anyone else is refused before accept). The user's message is
stored before generation starts; the reply is stored when it ends, also when stopped (with the partial
text and finish_reason "canceled") or when it fails ("error"). Thin on purpose: frames are checked by
workbench/chat/frames.py, what a turn does to the conversation is Conversation.take_turn, and errors
go out through the one error path of workbench/api/json_socket.py.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

from channels.db import database_sync_to_async
from django.db import DatabaseError

from engine import SamplingParams
from engine.tokenizer import TokenizerError
from workbench.api.json_socket import FrameError, JsonSocketConsumer
from workbench.chat import frames, versions
from workbench.chat.fitting import fitted_prompt
from workbench.chat.models import Conversation, Message, ReplyUnderWay, Turn
from workbench.serving import bridge, limits
from workbench.serving.streams import StreamEvent


class ChatConsumer(JsonSocketConsumer):
    bad_json_code = "invalid_frame"

    async def connect(self) -> None:
        found = await self._conversation()
        if found is None:
            await self.close(code=4404)
            return
        self.conversation: Conversation = found
        self.generation: asyncio.Task[None] | None = None
        self.engine_id: str | None = None
        self.stop_asked = False  # a stop (or close) before the request reached the transport
        await self.accept()

    @database_sync_to_async
    def _conversation(self) -> Conversation | None:
        user = self.scope.get("user")
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        return Conversation.owned_by(user).filter(pk=conversation_id).first() if user else None

    async def disconnect(self, code: int) -> None:
        if self._replying():
            self._stop()

    def _replying(self) -> bool:
        generation = getattr(self, "generation", None)
        return generation is not None and not generation.done()

    def _stop(self) -> None:
        self.stop_asked = True  # seen by _answer if its request is not submitted yet
        transport = bridge.running()  # never start (block on) a transport just to stop
        if self.engine_id and transport is not None:
            transport.cancel(self.engine_id)

    async def receive_json(self, content: dict[str, object], **kwargs: object) -> None:
        kind = frames.kind(content)
        if kind == "stop":
            if self._replying():
                self._stop()
            return
        if self._replying():
            raise FrameError("busy", "a reply is still being generated; stop it first")
        if not await self._still_signed_in():
            await self.send_error("signed_out", "you signed out (in this or another tab); sign in again")
            await self.close(code=4401)
            return
        text, params = frames.turn_request(kind, content)
        user = self.scope["user"]
        assert user is not None  # connect refused a socket without one
        # Admitted before the turn is taken: a refused one stores nothing.
        try:
            admission = limits.admit(user.username)
        except limits.Refused as exc:
            raise FrameError(exc.code, exc.message, retry_after=exc.retry_after) from None
        try:
            prepared = await self._take_turn(kind, text)
        except BaseException:
            admission.release()
            raise
        if prepared is None:
            admission.release()
            return
        # The id and the stop flag are this request's before the task runs: a stop that comes while the
        # transport is still starting (the first request after a restart) must reach it.
        engine_id = self.engine_id = f"chat-{self.conversation.pk}-{uuid.uuid4().hex}"
        self.stop_asked = False
        self.generation = asyncio.create_task(self._generate(engine_id, *prepared, params, admission))

    async def _take_turn(self, turn: Turn, text: str | None) -> tuple[list[dict[str, str]], datetime] | None:
        """The history to answer and the conversation's claim; None once the page has been told why not."""
        try:
            prepared = await database_sync_to_async(self.conversation.take_turn)(turn, text)
        except ReplyUnderWay:
            raise FrameError("busy", "a reply to this conversation is being generated (in another tab?); "
                                     "wait for it or stop it there") from None
        except Conversation.DoesNotExist:
            await self._gone()
            return None
        except DatabaseError:
            if await self._exists():
                raise
            await self._gone()
            return None
        if prepared is None:
            raise FrameError("invalid_request", "nothing to regenerate or edit yet")
        return prepared

    async def _generate(self, engine_id: str, history: list[dict[str, str]], claim: datetime,
                        params: SamplingParams, admission: limits.Admission) -> None:
        try:
            await self._answer(engine_id, history, params, admission)
        finally:
            admission.release()  # its stream's end released it already, unless it never reached the transport
            await database_sync_to_async(self.conversation.release_reply)(claim)

    async def _answer(self, engine_id: str, history: list[dict[str, str]], params: SamplingParams,
                      admission: limits.Admission) -> None:
        transport = await bridge.transport_from_loop()
        try:
            prompt = await asyncio.to_thread(fitted_prompt, transport.tokenizer, history)  # long ones take a while
        except TokenizerError as exc:
            await self.send_error("invalid_request", str(exc))
            return
        await self.send_json({"type": "started"})
        text, event = "", StreamEvent()
        stream = admission.submit(transport, engine_id, prompt, params)
        if self.stop_asked:
            transport.cancel(engine_id)
        async for event in stream:
            if event.text:
                text += event.text
                await self.send_json({"type": "delta", "index": event.index, "text": event.text})
        try:
            message = await self._store_reply(text, event)
        except DatabaseError:
            if await self._exists():
                raise
            await self._gone()  # deleted while it was answered
            return
        await self.send_json({"type": "done", "message_id": message.pk, "finish_reason": event.finish_reason,
                              "error": event.error, "usage": event.usage, "timings": event.timings,
                              "title": self.conversation.title, "versions": await self._versions(message)})

    @database_sync_to_async
    def _still_signed_in(self) -> bool:
        """False once the session this socket was opened with is gone: logging out (in any tab) deletes
        it, and a socket opened before must not go on generating in the user's name. (A socket without
        a session key was not opened by a session.)"""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        return session is None or key is None or bool(session.exists(key))

    @database_sync_to_async
    def _versions(self, reply: Message) -> dict[str, object] | None:
        """Where the reply stands among its versions, for the page's < n/m > (None: no longer shown)."""
        found = versions.of(self.conversation, reply.pk)
        return None if found is None else found.as_frame()

    @database_sync_to_async
    def _exists(self) -> bool:
        return Conversation.objects.filter(pk=self.conversation.pk).exists()

    async def _gone(self) -> None:
        await self.send_error("conversation_gone", "this conversation was deleted")
        await self.close(code=4404)

    @database_sync_to_async
    def _store_reply(self, text: str, event: StreamEvent) -> Message:
        usage, timings = event.usage or {}, event.timings or {}
        return self.conversation.add_reply(
            content=text, finish_reason=event.finish_reason or "",
            error=event.error or "", prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"), time_to_first_token=timings.get("time_to_first_token"),
            decode_tokens_per_s=timings.get("decode_tokens_per_s"))
