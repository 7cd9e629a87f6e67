"""The dashboard socket, /ws/ops/dashboard: staff only (anyone else is refused before accept).

Every PUSH_EVERY_S it sends what changed of the transport's view of every worker (device, model,
flags, load, and the engine's inspection snapshot, engine/inspection.py) together with the flag
registry; operators with the `ops.flip_flags` permission may send flag changes, answered with every
worker's answer and logged like the HTTP ones (workbench/ops/flag_changes.py).

    -> {"type": "state", "workers": {worker: {...}}, "flags": [...]}
    <- {"type": "set_flag", "id": any, "name": "ARC_GRAPH_DEVICE_LOOP", "value": false, "worker": "w1"}
    -> {"type": "flag_result", "id": any, "change": 12, "answers": {"w1": {"in_force": {...}}}}
    -> {"type": "error", "id": any, "code": "forbidden" | "invalid_change" | "invalid_frame", "message": "..."}
"""

from __future__ import annotations

import asyncio
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from engine.capabilities import UnknownFlag
from workbench.ops import flag_changes
from workbench.serving import bridge

PUSH_EVERY_S = 0.25
MAX_FRAME_CHARS = 4096  # a flag change is a few dozen characters


class DashboardConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close(code=4403)
            return
        self.transport = await asyncio.to_thread(bridge.transport)
        await self.accept()
        self.pushing = asyncio.create_task(self._push_forever())

    async def disconnect(self, code) -> None:
        if getattr(self, "pushing", None):
            self.pushing.cancel()

    async def _push_forever(self) -> None:
        last = None
        while True:
            frame = json.dumps({"type": "state", "workers": self.transport.workers_view(),
                                "flags": flag_changes.listing(self.transport)})
            if frame != last:
                await self.send(text_data=frame)
                last = frame
            await asyncio.sleep(PUSH_EVERY_S)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            if text_data is None or len(text_data) > MAX_FRAME_CHARS:
                raise ValueError(f"frames are JSON text of at most {MAX_FRAME_CHARS} characters")
            frame = json.loads(text_data)
            if not isinstance(frame, dict) or frame.get("type") != "set_flag":
                raise ValueError("the one frame this socket takes is {\"type\": \"set_flag\", ...}")
        except ValueError as exc:
            await self._error(None, "invalid_frame", str(exc))
            return
        asked = frame.get("id")
        refusal = await database_sync_to_async(flag_changes.refusal)(self.scope["user"])
        if refusal is not None:
            await self._error(asked, "forbidden", refusal)
            return
        try:
            name, value, worker = flag_changes.parse(frame)
        except (ValueError, UnknownFlag) as exc:
            await self._error(asked, "invalid_change", str(exc).strip("'\""))
            return
        result = await flag_changes.make(self.transport, self.scope["user"], name, value, worker)
        await self.send(text_data=json.dumps({"type": "flag_result", "id": asked, **result}))

    async def _error(self, asked, code: str, message: str) -> None:
        await self.send(text_data=json.dumps({"type": "error", "id": asked, "code": code, "message": message}))
