"""The chat page's websocket, /ws/chat/<id>: send, stop, regenerate and edit for one conversation.

Only the conversation's owner connects, with the session of a signed-in page (anyone else, and an API
token whoever it belongs to, is refused before accept), and only while they may: each frame checks that
the user is still active and the session still signed in, and logging out closes the socket at once
(workbench/protocol/socket_access.py). The user's message is stored before generation starts; the
reply is stored when it ends, also when stopped (with the partial text and finish_reason "canceled")
or when it fails ("error"). Thin on purpose: frames are checked by
workbench/chat/frames.py, what a turn does to the conversation is Conversation.take_turn, and errors
go out through the one error path of workbench/protocol/json_socket.py, except those of a reply under way:
they go out as its frames do (LiveReply.publish), to every socket following it and after every delta
before them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime

from channels.db import database_sync_to_async
from django.db import DatabaseError

from engine import SamplingParams
from engine.loading.tokenizer import TokenizerError
from workbench.chat import frames, live, versions
from workbench.chat.fitting import fitted_prompt
from workbench.chat.models import Conversation, Message, NotShown, ReplyUnderWay, Turn
from workbench.protocol import socket_access
from workbench.protocol.json_socket import FrameError, JsonSocketConsumer
from workbench.protocol.model_choice import model_of
from workbench.serving import bridge, limits, served_models
from workbench.serving.streams import StreamEvent

log = logging.getLogger(__name__)
# The close code of a handshake made with an API token (the handshake's answer is a 403).
API_TOKEN_REFUSED = 4403
# Sent to every socket following a reply to a conversation deleted meanwhile, each then closed.
GONE: live.Frame = {"type": "error", "code": "conversation_gone", "message": "this conversation was deleted"}


class ChatConsumer(JsonSocketConsumer):
    bad_json_code = "invalid_frame"

    async def connect(self) -> None:
        if self.scope.get("bearer_token") is not None:
            # API tokens are for the APIs: a token copied off a laptop must not read (resume) or extend
            # its owner's conversations. Browsers send none on a websocket: the page loses nothing.
            await self.close(code=API_TOKEN_REFUSED)
            return
        found = await self._conversation()
        if found is None:
            await self.close(code=4404)
            return
        self.conversation: Conversation = found
        self.generation: asyncio.Task[None] | None = None
        self.reply_ended = False
        self.engine_id: str | None = None
        self.stop_asked = False  # a stop before the request reached the transport
        # Frames of a reply this socket follows (its own or one it resumed), sent in order by _pump.
        self.outbox: asyncio.Queue[live.Frame] = asyncio.Queue()
        self.following: live.LiveReply | None = None
        self.pump = asyncio.create_task(self._pump())
        await self.accept()

    async def _pump(self) -> None:
        while True:
            frame = await self.outbox.get()
            await self.send_json(frame)
            if frame is GONE:
                await self.close(code=4404)
                return

    @database_sync_to_async
    def _conversation(self) -> Conversation | None:
        user = self.scope.get("user")
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        return Conversation.owned_by(user).filter(pk=conversation_id).first() if user else None

    async def disconnect(self, code: int) -> None:
        # A dropped socket does not stop its reply: it runs on, stored when it ends, and the page
        # follows it again when it reconnects (a `resume` frame). Only `stop` stops it.
        following = getattr(self, "following", None)
        if following is not None:
            following.unfollow(self.outbox.put_nowait)
        if hasattr(self, "pump"):
            self.pump.cancel()

    def _replying(self) -> bool:
        """Whether this socket's reply is still under way. Not once it has ended (its last frame
        published): what is left of its task is giving the conversation back, a database call that the
        next turn's own database calls queue behind on their shared thread, so a turn sent as soon as the
        page hears the end is taken, not refused `busy`."""
        generation = getattr(self, "generation", None)
        return generation is not None and not generation.done() and not self.reply_ended

    async def refuse(self, refusal: socket_access.Refusal) -> None:
        # A reply outlives its socket's drop, but not its user's loss of the socket: it is stopped
        # (stored as far as it got, "canceled") before the socket closes.
        if hasattr(self, "conversation"):  # (a socket refused at connect has none)
            self._stop_reply()
        await super().refuse(refusal)

    def _stop_reply(self) -> None:
        """Stops the conversation's reply under way: this socket's own, or one it resumed."""
        if self._replying():
            self._stop()
        elif (under_way := live.of(self.conversation.pk)) is not None:
            self._cancel(under_way.engine_id)

    def _stop(self) -> None:
        self.stop_asked = True  # seen by _answer if its request is not submitted yet
        if self.engine_id:
            self._cancel(self.engine_id)

    @staticmethod
    def _cancel(engine_id: str) -> None:
        transport = bridge.running()  # never start (block on) a transport just to stop
        if transport is not None:
            transport.cancel(engine_id)

    async def _resume(self, from_offset: int) -> None:
        """Follow the reply under way from `from_offset`, or, if none is, send the last reply shown as
        stored (a `done` frame with its `content`), which the page puts in place of what it had."""
        under_way = live.of(self.conversation.pk)
        if under_way is not None:
            if self.following is not under_way:
                self.following = under_way
                under_way.follow(self.outbox.put_nowait, from_offset)
            return
        message = await database_sync_to_async(
            lambda: self.conversation.shown_messages().filter(role="assistant").last())()
        # Through the outbox, behind any frame of a reply this socket followed that is still to go out.
        if message is None:
            self.outbox.put_nowait({"type": "done", "content": None})
            return
        self.outbox.put_nowait({"type": "done", "content": message.content, **await self._stored_done_fields(message)})

    async def receive_json(self, content: dict[str, object], **kwargs: object) -> None:
        kind = frames.kind(content)
        if kind == "stop":
            self._stop_reply()
            return
        if kind == "resume":
            await self._resume(frames.resume_offset(content))
            return
        if self._replying():
            raise FrameError("busy", "a reply is still being generated; stop it first")
        text, params = frames.turn_request(kind, content)
        edited = frames.edited_message(content) if kind == "edit" else None
        model = model_of(content, await served_models.served_from_loop())
        try:
            frames.fit_vocabulary(params, served_models.vocabulary_of(model))
        except served_models.TokenizerUnreadable as exc:
            raise FrameError("unavailable", exc.message) from None
        user = self.scope["user"]
        assert user is not None  # connect refused a socket without one
        # Admitted before the turn is taken: a refused one stores nothing.
        try:
            admission = limits.admit(user.username)
        except limits.Refused as exc:
            raise FrameError(exc.code, exc.message, retry_after=exc.retry_after) from None
        try:
            prepared = await self._take_turn(kind, text, edited)
        except BaseException:
            admission.release()
            raise
        if prepared is None:
            admission.release()
            return
        # The id and the stop flag are this request's before the task runs: a stop that comes while the
        # transport is still starting (the first request after a restart) must reach it.
        engine_id = self.engine_id = f"chat-{self.conversation.pk}-{uuid.uuid4().hex}"
        self.stop_asked, self.reply_ended = False, False
        under_way = live.start(self.conversation.pk, engine_id)
        self.following = under_way
        under_way.follow(self.outbox.put_nowait, 0)
        self.generation = asyncio.create_task(
            self._generate(under_way, engine_id, *prepared, params, model, admission))

    async def _take_turn(self, turn: Turn, text: str | None, edited: int | None,
                         ) -> tuple[list[dict[str, str]], datetime, dict[str, object]] | None:
        """The history to answer, the conversation's claim, and the user message answered (its id and
        versions, for the page's `started` frame); None once the page has been told why not."""
        def take() -> tuple[list[dict[str, str]], datetime, dict[str, object]] | None:
            taken = self.conversation.take_turn(turn, text, edited)
            if taken is None:
                return None
            asked = versions.shown(self.conversation)
            last = next(s for s in reversed(asked) if s.message.role == "user")
            return (*taken, {"message_id": last.message.pk, "versions": last.as_frame()})
        try:
            prepared = await database_sync_to_async(take)()
        except ReplyUnderWay:
            raise FrameError("busy", "a reply to this conversation is being generated (in another tab?); "
                                     "wait for it or stop it there") from None
        except NotShown as exc:
            raise FrameError("invalid_request", str(exc)) from None
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

    async def _generate(self, under_way: live.LiveReply, engine_id: str, history: list[dict[str, str]],
                        claim: datetime, asked: dict[str, object], params: SamplingParams, model: str,
                        admission: limits.Admission) -> None:
        try:
            await self._answer(under_way, engine_id, history, asked, params, model, admission)
        except Exception:  # a bug: the pages following the reply are told, instead of waiting for ever
            log.exception("a chat reply failed")
            under_way.publish({"type": "error", "code": "internal_error",
                               "message": "the server failed on this reply (it is logged)"})
        finally:
            admission.release()  # its stream's end released it already, unless it never reached the transport
            live.end(self.conversation.pk, under_way)
            if self.generation is asyncio.current_task():
                self.reply_ended = True
            await database_sync_to_async(self.conversation.release_reply)(claim)

    async def _answer(self, under_way: live.LiveReply, engine_id: str, history: list[dict[str, str]],
                      asked: dict[str, object], params: SamplingParams, model: str,
                      admission: limits.Admission) -> None:
        transport = await bridge.transport_from_loop()
        try:
            tokenizer = await asyncio.to_thread(served_models.tokenizer_of, transport, model)  # read once per model
        except served_models.TokenizerUnreadable as exc:
            under_way.publish({"type": "error", "code": "unavailable", "message": exc.message})
            return
        if tokenizer.chat_template is None:
            under_way.publish({"type": "error", "code": "no_chat_template", "message":
                               f"{model} has no chat template: it is a base model that continues text, not a "
                               "chat model. Choose another model, or send it prompts through /v1/completions."})
            return
        try:
            prompt = await asyncio.to_thread(fitted_prompt, tokenizer, history, model)  # long ones take a while
        except TokenizerError as exc:
            under_way.publish({"type": "error", "code": "invalid_request", "message": str(exc)})
            return
        under_way.publish({"type": "started", "asked": asked, "thinks": tokenizer.thinks})
        text, event = "", StreamEvent()
        stream = admission.submit(transport, engine_id, prompt, params, model, keep_record=False)  # kept with the reply
        if self.stop_asked:
            transport.cancel(engine_id)
        async for event in stream:
            if event.text:
                text += event.text
                under_way.publish({"type": "delta", "index": event.index, "text": event.text})
        try:
            message = await self._store_reply(text, event, model)
        except (DatabaseError, Conversation.DoesNotExist):
            if await self._exists():
                raise
            under_way.publish(GONE)  # deleted while it was answered
            return
        under_way.publish({"type": "done", **await self._done_fields(
            message, event.finish_reason, event.error, event.usage, event.timings)})

    async def _done_fields(self, message: Message, finish_reason: str | None, error: str | None,
                           usage: dict | None, timings: dict | None) -> dict[str, object]:
        """A reply's `done` fields: how it ended, and the stored reply's id, model and place among its
        versions. The live reply's ending is the engine's; a resumed one's is what was stored of it."""
        return {"message_id": message.pk, "finish_reason": finish_reason, "error": error, "usage": usage,
                "timings": timings, "title": self.conversation.title, "versions": await self._versions(message),
                "model": message.model}

    async def _stored_done_fields(self, message: Message) -> dict[str, object]:
        """A stored reply's `done` fields, as the frame that ended it carried them."""
        usage = None if message.completion_tokens is None else {
            "prompt_tokens": message.prompt_tokens, "completion_tokens": message.completion_tokens,
            "cached_tokens": message.cached_tokens}
        timings = {"time_to_first_token": message.time_to_first_token,
                   "decode_tokens_per_s": message.decode_tokens_per_s}
        return await self._done_fields(message, message.finish_reason, message.error or None, usage, timings)

    @database_sync_to_async
    def _versions(self, reply: Message) -> dict[str, object] | None:
        """Where the reply stands among its versions, for the page's < n/m > (None: no longer shown)."""
        found = versions.of(self.conversation, reply.pk)
        return None if found is None else found.as_frame()

    @database_sync_to_async
    def _exists(self) -> bool:
        return Conversation.objects.filter(pk=self.conversation.pk).exists()

    async def _gone(self) -> None:
        self.outbox.put_nowait(GONE)  # the pump closes the socket once it has sent it

    @database_sync_to_async
    def _store_reply(self, text: str, event: StreamEvent, model: str) -> Message:
        usage, timings = event.usage or {}, event.timings or {}
        return self.conversation.add_reply(
            content=text, model=model, finish_reason=event.finish_reason or "",
            error=event.error or "", prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"), cached_tokens=usage.get("cached_tokens"),
            time_to_first_token=timings.get("time_to_first_token"),
            decode_tokens_per_s=timings.get("decode_tokens_per_s"), reproduce=event.reproduce)
