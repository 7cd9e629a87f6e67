"""An open socket keeps the answer "its user may still use it" for WORKBENCH_SOCKET_RECHECK_S
(workbench/protocol/json_socket.py, socket_access.py): a flood of frames is not a flood of queries on
the one thread every socket's database calls share, a change saved in this process ends the kept
answer at once, and a change made elsewhere is seen once the answer is older than the setting.

In-process (Channels' WebsocketCommunicator), on a clock of the test's own; every frame is a cancel of
a request the socket is not running, answered `unknown_request_id` once it is let in.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from tests.workbench.test_input_share import Clock
from workbench.api.models import ApiToken
from workbench.asgi import application
from workbench.protocol import json_socket, socket_access

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

CANCEL = json.dumps({"type": "cancel", "request_id": "none"})


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(json_socket, "time", SimpleNamespace(monotonic=clock))
    return clock


@pytest.fixture
def asked(monkeypatch) -> list[int]:
    """One entry per access check that reached the database."""
    calls: list[int] = []
    real = socket_access.refusal

    async def counted(*args, **kwargs):
        calls.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(socket_access, "refusal", counted)
    return calls


async def connect(token: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(application, "/ws/v1/generate", headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, _ = await ws.connect()
    assert connected
    return ws


async def answer(ws: WebsocketCommunicator) -> str:
    await ws.send_to(text_data=CANCEL)
    return json.loads(await ws.receive_from(timeout=10))["code"]


async def test_a_flood_of_frames_asks_the_database_once_per_recheck_window(api_user, settings, clock, asked):
    settings.WORKBENCH_SOCKET_RECHECK_S = 1.0
    ws = await connect(api_user[1])
    codes = [await answer(ws) for _ in range(10)]
    assert codes == ["unknown_request_id"] * 10, codes
    assert len(asked) == 1, f"ten frames within the window: {len(asked)} queries"
    clock.now += 1.0
    assert await answer(ws) == "unknown_request_id"
    assert len(asked) == 2, "the window over, the next frame asks again"
    settings.WORKBENCH_SOCKET_RECHECK_S = 0
    for _ in range(3):
        await answer(ws)
    assert len(asked) == 5, "0: every frame asks"
    await ws.disconnect()


async def test_a_revoke_saved_by_this_process_ends_the_kept_answer_at_once(api_user, settings, clock, asked):
    settings.WORKBENCH_SOCKET_RECHECK_S = 60
    user, token = api_user
    ws = await connect(token)
    assert await answer(ws) == "unknown_request_id", "liveness: the token's socket is answered"
    saved = await database_sync_to_async(ApiToken.objects.get)(user=user)
    await database_sync_to_async(saved.revoke)()
    assert await answer(ws) == "token_revoked", "a kept answer outlived the revoke"
    assert (await ws.receive_output(timeout=10))["code"] == 4401
    assert len(asked) == 2


async def test_a_change_made_elsewhere_is_seen_once_the_kept_answer_is_older_than_the_setting(api_user, settings, clock):
    """A queryset update sends no signal: as a revoke by another web process (or in the database) looks here."""
    settings.WORKBENCH_SOCKET_RECHECK_S = 1.0
    user, token = api_user
    ws = await connect(token)
    assert await answer(ws) == "unknown_request_id"
    await database_sync_to_async(ApiToken.objects.filter(user=user).update)(revoked_at=timezone.now())
    clock.now += 0.9
    assert await answer(ws) == "unknown_request_id", "within the window the kept answer stands"
    clock.now += 0.1
    assert await answer(ws) == "token_revoked", "once it is older than the setting the frame asks again"
    assert (await ws.receive_output(timeout=10))["code"] == 4401
