"""Runtime flags per worker over /ops/flags, against both transports: a flip reaches the chosen worker
at its next step boundary and no other, is answered and written to the audit log; a start-only flag
is refused with its reason; a flip for all workers reaches one that starts later; only operators may
look or flip; flips while requests stream change no response."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import AsyncClient

from tests.cluster import Cluster
from tests.workbench.test_celery_cluster import served_by
from tests.workbench.test_websocket_api import connect, frames_until_done, greedy_solo, wait_for
from workbench.ops.models import FlagChange
from workbench.serving import bridge, wire

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("olga", password="pw-olga-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="flip_flags"))
    return user


async def client_for(user) -> AsyncClient:
    client = AsyncClient()
    await client.aforce_login(user)
    return client


async def flip(client: AsyncClient, **change):
    return await client.post("/ops/flags", json.dumps(change), content_type="application/json")


@pytest.mark.usefixtures("serving_transport")
async def test_a_flip_reaches_one_worker_and_is_audited(operator):
    client = await client_for(operator)
    before = bridge.transport().flags_in_force()
    target = sorted(before)[0]
    was = before[target]["ARC_GRAPH_DEVICE_LOOP"]
    try:
        response = await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=not was, worker=target)
        assert response.status_code == 200 and list(response.json()["answers"]) == [target]
        assert response.json()["answers"][target]["in_force"]["ARC_GRAPH_DEVICE_LOOP"] is (not was)
        assert await wait_for(lambda: bridge.transport().flags_in_force()[target]["ARC_GRAPH_DEVICE_LOOP"] is (not was))
        listing = (await client.get("/ops/flags")).json()["flags"]
        device_loop = next(f for f in listing if f["name"] == "ARC_GRAPH_DEVICE_LOOP")
        assert device_loop["in_force"] == {w: (not was) if w == target else flags["ARC_GRAPH_DEVICE_LOOP"]
                                           for w, flags in before.items()}, "only the chosen worker changed"
        change = await FlagChange.objects.aget()
        assert (change.name, change.value, change.workers, change.all_workers) == \
            ("ARC_GRAPH_DEVICE_LOOP", not was, [target], False)
        assert change.user_id == operator.pk
    finally:
        await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=was, worker=target)


@pytest.mark.usefixtures("serving_transport")
async def test_a_start_only_flag_is_refused_with_its_reason(operator):
    client = await client_for(operator)
    response = await flip(client, name="ARC_CAPTURE_STREAM", value=True)
    answers = response.json()["answers"]
    assert answers and all("fixed at start" in answer["error"] for answer in answers.values())
    change = await FlagChange.objects.aget()
    assert change.refused_by == sorted(answers) and change.all_workers


@pytest.mark.parametrize("body, message", [
    ({"name": "ARC_NOPE", "value": True}, "unknown flag"),
    ({"name": "ARC_GRAPH_DEVICE_LOOP", "value": 1}, "true or false"),
    ({"name": "ARC_GRAPH_VERIFY_REPLAYS", "value": -2}, "whole number"),
    ({"name": "ARC_GRAPH_VERIFY_REPLAYS", "value": 2, "worker": 7}, "worker id"),
])
async def test_a_bad_change_is_refused_and_not_logged(operator, body, message):
    response = await flip(await client_for(operator), **body)
    assert response.status_code == 400 and message in response.json()["error"]
    assert await FlagChange.objects.acount() == 0


@pytest.mark.parametrize("who", ["anonymous", "user", "staff without the permission"])
async def test_only_operators_see_or_flip_flags(django_user_model, who):
    client = AsyncClient()
    if who != "anonymous":
        user = await django_user_model.objects.acreate(username="ursula", is_staff=who.startswith("staff"))
        await client.aforce_login(user)
    assert (await client.get("/ops/flags")).status_code == 403
    assert (await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=False)).status_code == 403
    assert await FlagChange.objects.acount() == 0


async def test_a_flip_for_all_workers_reaches_a_worker_started_later(operator, tmp_path):
    cluster = Cluster(settings.REDIS_URL, tmp_path)
    try:
        await asyncio.to_thread(cluster.start_workers, 1)
        with served_by(cluster) as transport:
            response = await flip(await client_for(operator), name="ARC_GRAPH_VERIFY_REPLAYS", value=3)
            assert [a["in_force"]["ARC_GRAPH_VERIFY_REPLAYS"] for a in response.json()["answers"].values()] == [3]
            [late] = await asyncio.to_thread(cluster.start_workers, 1)
            late_id = cluster.worker_id(late)
            assert await wait_for(lambda: transport.flags_in_force().get(late_id, {}).get("ARC_GRAPH_VERIFY_REPLAYS") == 3,
                                  timeout=10)
    finally:
        cluster.stop()


@pytest.mark.usefixtures("serving_transport")
async def test_flips_while_requests_stream_change_no_response(operator, api_user):
    client, ws = await client_for(operator), await connect(api_user[1])
    prompts = {f"s{i}": p for i, p in enumerate(["The list type", "A dictionary is", "This module provides",
                                                 "Return the number of", "Each thread has", "The default value is"])}
    for rid, prompt in prompts.items():
        await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": rid, "prompt": prompt,
                                               "params": {"max_tokens": 48, "temperature": 0, "ignore_eos": True}}))
    was = bridge.transport().flags_in_force()
    flips = [await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=bool(i % 2)) for i in range(6)]
    frames = await frames_until_done(ws, set(prompts))
    for worker, flags in was.items():
        await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=flags["ARC_GRAPH_DEVICE_LOOP"], worker=worker)
    assert all(r.status_code == 200 for r in flips) and await FlagChange.objects.acount() == 6 + len(was)
    for rid, prompt in prompts.items():
        tokens = [t for f in frames if f.get("request_id") == rid and f["type"] == "delta" for t in f["token_ids"]]
        assert tokens == greedy_solo(prompt, 48), f"{rid} changed under the flips"
    await ws.disconnect()


@pytest.mark.usefixtures("serving_transport")
async def test_a_flip_for_an_unknown_worker_changes_nothing_and_says_so(operator):
    client = await client_for(operator)
    before = bridge.transport().flags_in_force()
    response = await flip(client, name="ARC_GRAPH_VERIFY_REPLAYS", value=5, worker="no-such-worker")
    assert response.json()["answers"] == {"no-such-worker": {"error": "no such worker"}}
    await asyncio.sleep(0.5)
    assert bridge.transport().flags_in_force() == before
    assert (await FlagChange.objects.aget()).refused_by == ["no-such-worker"]


async def test_a_flip_without_the_csrf_token_is_refused(operator):
    client = AsyncClient(enforce_csrf_checks=True)
    await client.aforce_login(operator)
    assert (await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=False)).status_code == 403
    assert await FlagChange.objects.acount() == 0


async def test_a_garbled_flag_message_is_refused_and_the_worker_serves_on(celery_cluster):
    """Straight onto a worker's control channel, past the web side's checks."""
    with served_by(celery_cluster) as transport:
        layer = wire.make_layer()
        reply = await layer.new_channel()
        worker_id = sorted(transport.workers())[0]
        garbled = [{"name": ["ARC_GRAPHS"], "value": True}, {"name": "ARC_GRAPHS", "value": None},
                   {"name": "ARC_GRAPH_VERIFY_REPLAYS", "value": "3"}, {"name": None, "value": {}}]
        for n, fields in enumerate(garbled):
            await layer.send(wire.control_channel(worker_id),
                             {"type": wire.SET_FLAG, "change_id": f"g{n}", "reply_channel": reply, **fields})
        answers = [await asyncio.wait_for(layer.receive(reply), 10) for _ in garbled]
        assert all(answer["error"] and answer["in_force"] is None for answer in answers)
        await layer.close_pools()
        # Its engine thread lives on: a proper change is applied and answered by it.
        current = transport.flags_in_force()[worker_id]["ARC_GRAPH_VERIFY_REPLAYS"]
        answer = await transport.change_flag("ARC_GRAPH_VERIFY_REPLAYS", current, [worker_id])
        assert answer[worker_id]["in_force"]["ARC_GRAPH_VERIFY_REPLAYS"] == current
