"""JsonSocketConsumer: the one base of the three websocket consumers (the API's, the chat's, the
dashboard's), with the one frame-size rule and the one error path they share.

A frame is counted in bytes (the UTF-8 of a text frame, a binary frame's own bytes) against
WORKBENCH_MAX_FRAME_BYTES before any JSON is parsed, so an oversized frame costs no parse on any socket.
It is then parsed by workbench/protocol/json_input.py (lone surrogates and deep nesting refused) and handed
to `receive_json`. Whatever a frame does wrong is raised as FrameError and becomes one structured
`error` frame; anything else it raises is logged and answered with `internal_error`: a bug costs that
frame its answer, never the socket and every request on it.

Before all that, each frame is counted against the socket's frame budget, and each socket against its
user's open sockets (workbench/protocol/socket_limits.py). Served by workbench/serve.py, the budget and
the size limit are the socket's door's (workbench/protocol/frame_door.py), applied as the frame arrives,
before it is even read: the consumer gets only the refusal (`frame_refused`) and answers it. Then each
frame asks workbench/protocol/socket_access.py whether the socket's user may still use it (active,
still signed in, still staff where `needs_staff`, the API token not revoked): if not, the frame is
answered with that refusal's `error` and the socket closed with its code. The answer "it may" is kept
for WORKBENCH_SOCKET_RECHECK_S, or until a user, token or session is saved or deleted in this process
(socket_access.changes), so that a socket's flood of frames is not a flood of queries on the one
thread that every socket's database calls share. A socket opened with a session joins that session's
group, so that logging out closes it at once (`session_signed_out`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from asgiref.typing import WebSocketConnectEvent, WebSocketDisconnectEvent
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from workbench.protocol import frame_door, socket_access, socket_limits
from workbench.protocol.json_input import JsonInputError, parse_object

log = logging.getLogger(__name__)

PER_FRAME_EVENTS = frozenset({"websocket.receive", frame_door.FRAME_REFUSED_EVENT})


class FrameError(Exception):
    """A refused frame: its error code and message, and `echo`, the client's name for what was refused
    (a request_id, a change's id) on sockets whose error frames carry one; `retry_after`, for a
    refusal by a limit, the seconds after which the client may try again (sent as a field)."""

    def __init__(self, code: str, message: str, echo: object = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.echo, self.retry_after = code, message, echo, retry_after


class JsonSocketConsumer(AsyncJsonWebsocketConsumer):
    # The field of this socket's error frames that echoes FrameError.echo (None: they carry none).
    error_echo: ClassVar[str | None] = None
    # The code for a frame that is not a JSON object (None: json_input's own, invalid_json or
    # invalid_request): each socket keeps the codes its clients already handle.
    bad_json_code: ClassVar[str | None] = None
    # The socket is for operators: a user who is no longer staff is refused at the next frame.
    needs_staff: ClassVar[bool] = False
    # Gives this socket's place among its user's open sockets back (workbench/protocol/socket_limits.py).
    release_place: Callable[[], None] | None = None
    frame_bytes = 0  # the size of the frame being handled
    # When the last access check let the socket's user in, and socket_access.changes() then.
    allowed_at: tuple[float, int] | None = None

    @functools.cached_property
    def frame_budget(self) -> socket_limits.FrameBudget:
        return socket_limits.FrameBudget()

    @functools.cached_property
    def door(self) -> frame_door.FrameDoor | None:
        """The socket's door where the server has one (workbench/serve.py); else its checks are made here."""
        door = (self.scope.get("extensions") or {}).get(frame_door.SCOPE_KEY)
        return door if isinstance(door, frame_door.FrameDoor) else None

    async def websocket_connect(self, message: WebSocketConnectEvent) -> None:
        user = self.scope.get("user")
        if user is not None and user.is_authenticated:
            self.release_place = await asyncio.to_thread(socket_limits.open_socket, user.get_username(), self)
            if self.release_place is None:
                await self.accept()  # to say why: a refused handshake says nothing
                await self.send_error("too_many_sockets", f"you hold {settings.WORKBENCH_USER_SOCKETS} sockets on "
                                                          "this server already; close one first")
                await self.close(code=socket_limits.TOO_MANY_SOCKETS_CLOSE)
                return
        # Joined before connect() decides; a refused socket leaves it again in websocket_disconnect.
        group = socket_access.session_group(self.scope)
        if group is not None:
            self.groups = [*self.groups, group]
        await super().websocket_connect(message)

    async def websocket_disconnect(self, message: WebSocketDisconnectEvent) -> None:
        if self.release_place is not None:
            await asyncio.to_thread(self.release_place)
        await super().websocket_disconnect(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: object) -> None:
        if self.door is None and not self.frame_budget.take():  # before the frame costs anything: no query, no parse
            await self.frame_refused(frame_door.too_many_frames().event())
            return
        refusal = await self.access_refusal()
        if refusal is not None:
            await self.refuse(refusal)
            return
        try:
            await self.receive_json(self._frame(text_data, bytes_data))
        except FrameError as exc:
            await self.send_error(exc.code, exc.message, exc.echo, exc.retry_after)
        except Exception:
            log.exception("a websocket frame failed")
            await self.send_error("internal_error", "the server failed on this frame (it is logged); "
                                                    "the socket stays open")

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale database connections before every handler, a call queued on the one thread
        # that every socket's database calls share. A frame's own database calls (socket_access.refusal and
        # the consumers' helpers, all database_sync_to_async) close them there themselves, before and
        # after, and a refused frame makes none: neither waits in that queue for nothing.
        if message.get("type") in PER_FRAME_EVENTS:
            await getattr(self, get_handler_name(message))(message)
        else:
            await super().dispatch(message)

    async def frame_refused(self, event: dict[str, Any]) -> None:
        """A frame refused by the door (frame_door.FRAME_REFUSED_EVENT): answered, nothing of it read."""
        await self.send_error(event["code"], event["message"], retry_after=event["retry_after"])

    async def access_refusal(self) -> socket_access.Refusal | None:
        """socket_access.refusal, asked again only once the last "it may" is older than
        WORKBENCH_SOCKET_RECHECK_S or something it read has changed in this process since."""
        changes = socket_access.changes()
        if self.allowed_at is not None:
            at, seen = self.allowed_at
            if seen == changes and time.monotonic() - at < settings.WORKBENCH_SOCKET_RECHECK_S:
                return None
        self.allowed_at = None
        asked = time.monotonic()  # both read before the query: what changes while it runs is asked again
        refusal = await socket_access.refusal(self.scope, self.token_holder, staff=self.needs_staff)
        if refusal is None:
            self.allowed_at = (asked, changes)
        return refusal

    def token_holder(self, token: str) -> Any:
        """The active user of an API token sent on this socket, or None: a socket takes none unless its
        consumer says how to look them up (the API's does; the chat and the dashboard refuse them)."""
        return None

    async def refuse(self, refusal: socket_access.Refusal) -> None:
        """The user may use this socket no more: told why, then closed. A consumer that runs work of its
        own past a disconnect (the chat's reply) stops it first."""
        await self.send_error(refusal.code, refusal.message)
        await self.close(code=refusal.close_code)

    async def session_signed_out(self, event: dict[str, object]) -> None:
        """The channel layer's socket_access.SIGNED_OUT_EVENT: the session this socket was opened with logged out."""
        await self.refuse(socket_access.SIGNED_OUT)

    def _frame(self, text_data: str | None, bytes_data: bytes | None) -> dict[str, object]:
        # surrogatepass: a test client may send a str UTF-8 cannot carry; it is counted, then refused by the parse.
        size = len(bytes_data or b"") if text_data is None else len(text_data.encode("utf-8", "surrogatepass"))
        self.frame_bytes = size  # the frame's work is placed by its size (workbench/serving/input_work.py)
        too_large = frame_door.too_large(size)  # the door's, where there is one, refused it unread
        if too_large is not None:
            raise FrameError(too_large.code, too_large.message)
        if text_data is None:
            raise FrameError("invalid_frame", "frames must be JSON text, not binary")
        try:
            return parse_object(text_data)
        except JsonInputError as exc:
            raise FrameError(self.bad_json_code or exc.code, exc.message, self.echo_of(exc.partial)) from None

    def echo_of(self, refused: dict[str, object] | None) -> object:
        """What an error about the parsed but refused frame `refused` echoes (by default nothing: the
        frame holds text UTF-8 cannot carry, which an echo must not send back)."""
        return None

    async def receive_json(self, content: dict[str, object], **kwargs: object) -> None:
        raise NotImplementedError

    async def send_error(self, code: str, message: str, echo: object = None, retry_after: int | None = None) -> None:
        """The one way an error frame is sent on these sockets."""
        about = {} if self.error_echo is None else {self.error_echo: echo}
        retry = {} if retry_after is None else {"retry_after": retry_after}
        await self.send_json({"type": "error", **about, "code": code, "message": message, **retry})

    @classmethod
    async def encode_json(cls, content: object) -> str:
        return json.dumps(content, ensure_ascii=False)
