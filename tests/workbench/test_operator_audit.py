"""An operator picks another user's running request for the replay audit from the dashboard socket: once it
has finished, the engine re-runs it alone and /metrics counts it audited and equal. The suite runs with
the audit's random share at 0 (tests/settings.py), so a request nobody picked, finished beside it, is the
liveness control: it is not audited. A pick of a request no worker holds, or a frame without one, is refused."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.workbench.test_dashboard import _answer, dashboard, state_until
from tests.workbench.test_operator_cancel import held
from tests.workbench.test_reproduce import audit_counts, audited
from tests.workbench.test_websocket_api import connect, frames_until_done
from workbench.serving.inprocess import LOCAL_WORKER

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("quick_dashboard")]

# Sampled and seeded, long enough to be seen on the dashboard before it ends.
PARAMS = {"max_tokens": 300, "temperature": 0.8, "seed": 11, "ignore_eos": True}


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam", password="pw-sam-12345", is_staff=True)


async def test_an_operators_pick_is_audited_once_finished_and_an_unpicked_neighbour_is_not(staff, api_user):
    ws, api = await dashboard(staff), await connect(api_user[1])
    before = await audit_counts()
    for request_id in ("picked", "left"):
        await api.send_to(text_data=json.dumps({"type": "generate", "request_id": request_id, "prompt": "The list type",
                                                "params": PARAMS}))
    frame = await state_until(ws, lambda workers: held(workers, "picked"))
    engine_id = held(frame["workers"], "picked")[0]["request_id"]
    await ws.send_to(text_data=json.dumps({"type": "audit_request", "id": 1, "worker": LOCAL_WORKER,
                                           "request_id": engine_id}))
    answer = await _answer(ws)
    assert (answer["type"], answer["id"], answer["error"]) == ("audit_result", 1, None), answer
    ended = await frames_until_done(api, {"picked", "left"})
    assert {f["finish_reason"] for f in ended if f["type"] == "done"} == {"length"}

    assert await audited(1, before) == {"ed": 1, "_equal": 1, "_mismatched": 0}
    await asyncio.sleep(1.0)  # the engine is idle: an audit of the unpicked request would have run by now
    now = await audit_counts()
    assert now["ed"] - before["ed"] == 1, "only the picked request is audited"

    await ws.send_to(text_data=json.dumps({"type": "audit_request", "id": 2, "worker": LOCAL_WORKER,
                                           "request_id": engine_id}))  # over by now
    again = await _answer(ws)
    assert again["type"] == "audit_result" and "no such request" in again["error"]
    await ws.send_to(text_data=json.dumps({"type": "audit_request", "id": 3, "worker": LOCAL_WORKER}))
    bad = await _answer(ws)
    assert (bad["type"], bad["id"], bad["code"]) == ("error", 3, "invalid_audit") and "request_id" in bad["message"]
    await api.disconnect()
    await ws.disconnect()
