"""The dashboard socket, /ws/ops/dashboard: staff signed in with a session only (anyone else, and any
API token, is refused before accept). Every frame checks that the user is still active, signed in and
staff (workbench/protocol/socket_access.py; refused: `forbidden` or `signed_out` and closed), and so does
the push loop every RECHECK_S for a socket that sends nothing; logging out closes it at once. A flag
change also reads the user's permissions afresh, so an operator who loses `ops.flip_flags` has the next
change refused (`forbidden`) and keeps watching.

Every PUSH_EVERY_S it sends what changed of the transport's view of every worker (device, model,
flags, load, and the engine's inspection snapshot, engine/host/inspection.py) together with the flag
registry; operators with the `ops.flip_flags` permission may send flag changes, answered with every
worker's answer and logged like the HTTP ones (workbench/ops/flag_changes.py, which also checks them);
staff may cancel any request a worker holds, logged in the audit log (workbench/ops/request_cancels.py),
and pick any for the replay audit (re-run alone once finished, compared bit for bit with its record; the
result shows in the state's replay counts and, for a mismatch, as a leak event).
Frames are limited and refused like every socket's (workbench/protocol/json_socket.py).

    -> {"type": "state", "workers": {worker: {...}}, "flags": [...], "changes": [latest audit rows]}
    <- {"type": "set_flag", "id": any, "name": "ARC_GRAPH_DEVICE_LOOP", "value": false, "worker": "w1"}
    -> {"type": "flag_result", "id": any, "change": 12, "answers": {"w1": {"in_force": {...}}}}
    <- {"type": "cancel_request", "id": any, "worker": "w1", "request_id": "<as the state shows it>"}
    -> {"type": "cancel_result", "id": any, "cancel": 7, "error": null | "no such request on this worker ..."}
    <- {"type": "audit_request", "id": any, "worker": "w1", "request_id": "<as the state shows it>"}
    -> {"type": "audit_result", "id": any, "error": null | "no such request on this worker ..."}
    -> {"type": "error", "id": any, "code": "forbidden" | "signed_out" | "account_disabled" | "invalid_change"
        | "invalid_cancel" | "invalid_audit" | "invalid_frame" | "frame_too_large" | "internal_error", "message": "..."}
"""

from __future__ import annotations

import asyncio
import json
import logging

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from engine.host.capabilities import UnknownFlag
from workbench.ops import flag_changes, request_cancels
from workbench.protocol import socket_access
from workbench.protocol.json_socket import FrameError, JsonSocketConsumer
from workbench.serving import bridge

log = logging.getLogger(__name__)

PUSH_EVERY_S = 0.25
RECHECK_S = 5.0
CHANGES_EVERY_S = 2.0  # the audit log's latest rows (another operator's changes show within this)
REFUSED = 4403


@database_sync_to_async
def _current(user):
    """The user as the database has them now (None if deleted): staff status and permissions change."""
    return get_user_model().objects.filter(pk=user.pk).first()


def _is_staff(user) -> bool:
    return user is not None and user.is_authenticated and user.is_active and user.is_staff


class DashboardConsumer(JsonSocketConsumer):
    error_echo = "id"
    bad_json_code = "invalid_frame"
    needs_staff = True

    async def connect(self) -> None:
        if self.scope.get("bearer_token") or not _is_staff(self.scope.get("user")):
            await self.close(code=REFUSED)
            return
        self.transport = await bridge.transport_from_loop()
        await self.accept()
        self.unwatch = self.transport.watch_state()  # Celery workers send their sequence lists meanwhile
        self.pushing = asyncio.create_task(self._push_until_closed())

    async def disconnect(self, code: int) -> None:
        if getattr(self, "pushing", None):
            self.pushing.cancel()
        if getattr(self, "unwatch", None):
            self.unwatch()

    async def _push_until_closed(self) -> None:
        try:
            await self._push_forever()
        except asyncio.CancelledError:
            raise
        except Exception:  # a page that silently stops updating would be worse than a closed socket
            log.exception("dashboard push failed")
            await self.close(code=1011)

    async def _push_forever(self) -> None:
        clock = asyncio.get_running_loop().time
        last, checked, self.changes_read_at = None, clock(), 0.0
        while True:
            if clock() - checked > RECHECK_S:  # a socket that only watches sends no frame to be checked at
                refusal = await socket_access.refusal(self.scope, self.token_holder, staff=True)
                if refusal is not None:
                    await self.refuse(refusal)
                    return
                checked = clock()
            if clock() - self.changes_read_at > CHANGES_EVERY_S:
                self.changes = await database_sync_to_async(flag_changes.recent)()
                self.changes_read_at = clock()
            # allow_nan=False: a non-finite number would make the page's JSON.parse throw on every frame.
            frame = json.dumps({"type": "state", "workers": self.transport.workers_view(),
                                "flags": flag_changes.listing(self.transport), "changes": self.changes},
                               allow_nan=False)
            if frame != last:
                await self.send(text_data=frame)
                last = frame
            await asyncio.sleep(PUSH_EVERY_S)

    async def receive_json(self, content: dict[str, object], **kwargs: object) -> None:
        if content.get("type") in ("cancel_request", "audit_request"):
            await self._about_a_request(content)
            return
        asked = content.get("id")  # echoed by every answer, an error about the frame's type too
        if content.get("type") != "set_flag":
            raise FrameError("invalid_frame", "this socket takes {\"type\": \"set_flag\", ...}, "
                                              "{\"type\": \"cancel_request\", ...} and "
                                              "{\"type\": \"audit_request\", ...} frames", asked)
        user = await _current(self.scope["user"])
        refusal = "your account is gone" if user is None else await database_sync_to_async(flag_changes.refusal)(user)
        if refusal is not None:
            raise FrameError("forbidden", refusal, asked)
        try:
            name, value, worker = flag_changes.parse(content)
        except (ValueError, UnknownFlag) as exc:
            raise FrameError("invalid_change", str(exc).strip("'\""), asked) from None
        result = await flag_changes.make(self.transport, user, name, value, worker)
        self.changes_read_at = 0.0  # the next state shows this change in the log
        await self.send_json({"type": "flag_result", "id": asked, **result})

    async def _about_a_request(self, content: dict[str, object]) -> None:
        """A cancel (logged) or an audit pick of a request a worker holds: staff only, as the state names it."""
        asked, cancel = content.get("id"), content.get("type") == "cancel_request"
        user = await _current(self.scope["user"])  # staff status is read afresh: a demoted operator is refused
        refusal = request_cancels.refusal(user)
        if refusal is not None:
            raise FrameError("forbidden", refusal, asked)
        try:
            worker, request_id = request_cancels.parse(content)
        except ValueError as exc:
            raise FrameError("invalid_cancel" if cancel else "invalid_audit", str(exc), asked) from None
        if cancel:
            result = await request_cancels.make(self.transport, user, worker, request_id)
            await self.send_json({"type": "cancel_result", "id": asked, **result})
            return
        log.info("%s picked %s on %s for the replay audit", user.get_username(), request_id, worker)
        error = await self.transport.audit_as_operator(worker, request_id)
        await self.send_json({"type": "audit_result", "id": asked, "error": error})
