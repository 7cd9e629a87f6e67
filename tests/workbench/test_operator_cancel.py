"""An operator cancels another user's request from the dashboard socket: the request ends canceled in
the engine, the cancel is in the audit log with who asked and whom it served; a staff member demoted
meanwhile is refused and changes nothing; a cancel of a request no worker holds is logged as refused."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from tests.cluster import ROOT
from tests.workbench.test_dashboard import _answer, dashboard, state_until
from tests.workbench.test_websocket_api import connect, frames_until_done
from workbench.ops.models import RequestCancel
from workbench.serving.inprocess import LOCAL_WORKER

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("quick_dashboard")]

LONG = {"max_tokens": None, "temperature": 0, "ignore_eos": True}  # to the model's length: runs until canceled
DEMO_LENGTH = json.loads((ROOT / "engine/assets/demo/config.json").read_text())["max_position_embeddings"]


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam", password="pw-sam-12345", is_staff=True)


def held(workers, request_id: str) -> list[dict]:
    return [s for s in workers[LOCAL_WORKER]["state"]["sequences"] if s["request_id"].endswith(f"-{request_id}")]


async def running(ws, api, request_id: str) -> str:
    """Start `request_id` on the API socket; the engine's id for it, once the dashboard shows it."""
    await api.send_to(text_data=json.dumps({"type": "generate", "request_id": request_id, "prompt": "The list type",
                                            "params": LONG}))
    frame = await state_until(ws, lambda workers: held(workers, request_id))
    return held(frame["workers"], request_id)[0]["request_id"]


async def test_an_operator_cancels_another_users_request_and_it_is_in_the_audit_log(staff, api_user):
    ws, api = await dashboard(staff), await connect(api_user[1])
    engine_id = await running(ws, api, "victim")
    await ws.send_to(text_data=json.dumps({"type": "cancel_request", "id": 3, "worker": LOCAL_WORKER,
                                           "request_id": engine_id}))
    answer = await _answer(ws)
    ended = (await frames_until_done(api, {"victim"}))[-1]
    assert (answer["type"], answer["id"], answer["error"]) == ("cancel_result", 3, None), answer
    assert ended["type"] == "done" and ended["finish_reason"] == "canceled"
    assert ended["usage"]["completion_tokens"] < DEMO_LENGTH - ended["usage"]["prompt_tokens"], "stopped, not run to its end"
    record = await RequestCancel.objects.select_related("user").aget(pk=answer["cancel"])
    assert (record.user.username, record.worker, record.request_id, record.owner, record.error) == (
        "sam", LOCAL_WORKER, engine_id, "alice", "")

    await state_until(ws, lambda workers: not held(workers, "victim"))
    await ws.send_to(text_data=json.dumps({"type": "cancel_request", "id": 4, "worker": LOCAL_WORKER,
                                           "request_id": engine_id}))  # over by now
    again = await _answer(ws)
    assert again["type"] == "cancel_result" and "no such request" in again["error"]
    assert (await RequestCancel.objects.aget(pk=again["cancel"])).error == again["error"]
    await ws.send_to(text_data=json.dumps({"type": "cancel_request", "id": 5, "worker": LOCAL_WORKER}))
    bad = await _answer(ws)
    assert (bad["type"], bad["id"], bad["code"]) == ("error", 5, "invalid_cancel") and "request_id" in bad["message"]
    await api.disconnect()
    await ws.disconnect()


async def test_a_demoted_staff_member_cannot_cancel_and_the_request_runs_on(staff, api_user):
    ws, api = await dashboard(staff), await connect(api_user[1])
    engine_id = await running(ws, api, "kept")
    staff.is_staff = False
    await sync_to_async(staff.save)()
    await ws.send_to(text_data=json.dumps({"type": "cancel_request", "id": 9, "worker": LOCAL_WORKER,
                                           "request_id": engine_id}))
    answer = await _answer(ws)
    # The socket re-checks its user at the frame (workbench/protocol/socket_access.py): refused before
    # the cancel is read, so the error names no frame id, and the socket closes.
    assert (answer["type"], answer["code"]) == ("error", "forbidden"), answer
    assert await RequestCancel.objects.acount() == 0
    # ... and the request still generates: a cancel that went through would end it.
    for _ in range(3):
        frame = json.loads(await api.receive_from(timeout=30))
        assert frame["type"] != "done", frame
    await api.send_to(text_data=json.dumps({"type": "cancel", "request_id": "kept"}))  # its owner may
    ended = (await frames_until_done(api, {"kept"}))[-1]
    assert ended["type"] == "done" and ended["finish_reason"] == "canceled"
    await api.disconnect()
    await ws.disconnect()
