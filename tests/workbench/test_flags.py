"""Runtime flags per worker over /ops/flags, against both transports: a flip reaches the chosen worker
at its next step boundary and no other, is answered and written to the audit log; a start-only flag
is refused with its reason; a flip for all workers reaches one that starts later; only operators may
look or flip; many flips while 16 clients stream change no response, and each is in the audit log."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.conf import settings
from django.test import AsyncClient

from tests.cluster import Cluster
from tests.reference import greedy_solos
from tests.workbench.test_celery_cluster import served_by
from tests.workbench.test_websocket_api import connect, frames_until_done, wait_for
from workbench.ops.models import FlagChange
from workbench.serving import bridge
from workbench.serving.celery import wire
from workbench.serving.celery.redis_layer import make_layer

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


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
async def test_many_flips_while_16_clients_stream_change_no_response(operator, api_user):
    client, sockets = await client_for(operator), [await connect(api_user[1]) for _ in range(16)]
    for i, (ws, prompt) in enumerate(zip(sockets, SIXTEEN_PROMPTS)):
        await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": f"s{i}", "prompt": prompt,
                                               "params": {"max_tokens": STREAMED, "temperature": 0, "ignore_eos": True}}))
    # Every client is streaming before the first flip.
    begun = [await frames_until_first_delta(ws) for ws in sockets]
    was = bridge.transport().flags_in_force()
    # The device loop on and off, and its kill switch set and cleared, for every worker; each kind's
    # last flip leaves it off / armed (what stays stored for workers that start later); then each
    # worker back to what it had.
    asked = [("ARC_GRAPH_DEVICE_LOOP" if i % 2 == 0 else "ARC_DEVICE_LOOP_KILLED", (i // 2) % 2 == 0) for i in range(16)]
    flips = []
    for name, value in asked:
        flips.append(await flip(client, name=name, value=value))
        if len(flips) == len(asked) // 2:
            in_flight = bridge.transport().running_request_ids()
    rest = await asyncio.gather(*(frames_until_done(ws, {f"s{i}"}) for i, ws in enumerate(sockets)))
    frames = [first + later for first, later in zip(begun, rest)]
    for worker, flags in was.items():
        for name in ("ARC_GRAPH_DEVICE_LOOP", "ARC_DEVICE_LOOP_KILLED"):
            await flip(client, name=name, value=flags[name], worker=worker)
    assert in_flight, "liveness: the flips landed while requests were streaming"
    assert all(r.status_code == 200 and all("in_force" in a for a in r.json()["answers"].values()) for r in flips)
    logged = [(c.name, c.value, c.all_workers) async for c in FlagChange.objects.order_by("created_at", "id")]
    assert logged[:16] == [(name, value, True) for name, value in asked] and len(logged) == 16 + 2 * len(was)
    for i, (solo, mine) in enumerate(zip(greedy_solos(SIXTEEN_PROMPTS, STREAMED), frames)):
        tokens = [t for f in mine if f.get("request_id") == f"s{i}" and f["type"] == "delta" for t in f["token_ids"]]
        assert tokens == solo, f"s{i} changed under the flips"
    for ws in sockets:
        await ws.disconnect()


async def frames_until_first_delta(ws) -> list[dict]:
    frames = []
    while not frames or frames[-1]["type"] not in ("delta", "done", "error"):
        frames.append(json.loads(await ws.receive_from(timeout=30)))
    return frames


STREAMED = 120  # tokens per client: long enough that the middle flips land mid-stream
SIXTEEN_PROMPTS = ["The list type", "A dictionary is", "This module provides", "Return the number of",
                   "Each thread has", "The default value is", "import os", "class Node:", "def main():",
                   "An iterator is", "The file is opened", "Raise an exception", "For example,",
                   "The function returns", "Strings are", "Use the with statement"]


@pytest.mark.usefixtures("serving_transport")
async def test_a_flip_for_an_unknown_worker_changes_nothing_and_says_so(operator):
    client = await client_for(operator)

    def asked() -> dict[str, object]:
        """The flag asked of no worker, on each worker. (Only it: another test's restore of another flag
        can still be on its way to the heartbeats, and shows here in a random order.)"""
        return {worker: flags.get("ARC_GRAPH_VERIFY_REPLAYS") for worker, flags in bridge.transport().flags_in_force().items()}
    before = asked()
    assert before and 5 not in before.values(), before
    response = await flip(client, name="ARC_GRAPH_VERIFY_REPLAYS", value=5, worker="no-such-worker")
    assert response.json()["answers"] == {"no-such-worker": {"error": "no such worker"}}
    await asyncio.sleep(0.5)
    assert asked() == before
    assert (await FlagChange.objects.aget()).refused_by == ["no-such-worker"]


async def test_a_flip_without_the_csrf_token_is_refused(operator):
    client = AsyncClient(enforce_csrf_checks=True)
    await client.aforce_login(operator)
    assert (await flip(client, name="ARC_GRAPH_DEVICE_LOOP", value=False)).status_code == 403
    assert await FlagChange.objects.acount() == 0


async def test_a_garbled_flag_message_is_refused_and_the_worker_serves_on(celery_cluster):
    """Straight onto a worker's control channel, past the web side's checks."""
    with served_by(celery_cluster) as transport:
        layer = make_layer(settings.REDIS_URL)
        reply = await layer.new_channel()
        worker_id = sorted(transport.workers())[0]
        garbled = [{"name": ["ARC_GRAPHS"], "value": True}, {"name": "ARC_GRAPHS", "value": None},
                   {"name": "ARC_GRAPH_VERIFY_REPLAYS", "value": "3"}, {"name": None, "value": {}}]
        for n, fields in enumerate(garbled):
            await layer.send(wire.control_channel(settings.WORKBENCH_QUEUE_PREFIX, worker_id),
                             {"type": wire.SET_FLAG, "change_id": f"g{n}", "reply_channel": reply, **fields})
        answers = [await asyncio.wait_for(layer.receive(reply), 10) for _ in garbled]
        assert all(answer["error"] and answer["in_force"] is None for answer in answers)
        await layer.close_pools()
        # Its engine thread lives on: a proper change is applied and answered by it.
        current = transport.flags_in_force()[worker_id]["ARC_GRAPH_VERIFY_REPLAYS"]
        answer = await transport.change_flag("ARC_GRAPH_VERIFY_REPLAYS", current, [worker_id])
        assert answer[worker_id]["in_force"]["ARC_GRAPH_VERIFY_REPLAYS"] == current
