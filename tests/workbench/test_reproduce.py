"""Reproduce, for users, and the replay audit behind the serving layer (in-process).

A sampled reply with no seed (chat and API) keeps a record with a drawn seed, and re-deriving it says
"identical", also after the engine was stopped and started again (the record is in the database). The
records are their owner's: another user's reproduce is the same 404 as an unknown id. With the audit
at 1000 per mille, /metrics counts every re-run equal; the batched-row mutant of
tests/engine/test_replay_audit.py, applied to the served engine, is a mismatch and a leak event. Every
sampled request here has a seed but those that prove an unseeded one gets a recorded seed.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import torch
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from engine import SamplingParams
from engine.decode import runner
from tests.waiting import async_wait_until
from tests.workbench.test_chat import as_user, talk
from tests.workbench.test_metrics import scrape, total
from workbench.api.models import ApiToken, ReproduceRecord
from workbench.chat.models import Conversation, Message
from workbench.serving import bridge, limits

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("serving_transport")]
# What the web side alone does (isolation, the chat's record) and what needs the engine in this process
# (the mutant) run in-process; the round trip runs on both transports: over Celery the record comes
# back from the worker with the request's last event.
inprocess_only = pytest.mark.parametrize("serving_transport", ["inprocess"], indirect=True)

MESSAGES = [{"role": "user", "content": "What does the list type do?"}]


@pytest.fixture
def users(django_user_model):
    made = {}
    for name in ("rhea", "mallory"):
        user = django_user_model.objects.create_user(name, password=f"pw-{name}-123")
        made[name] = (user, ApiToken.issue(user, "test")[1])
    return made


async def completion(token: str, **body) -> dict:
    response = await AsyncClient().post("/v1/chat/completions", json.dumps({"model": "demo", "messages": MESSAGES,
                                                                             "max_tokens": 8, **body}),
                                        content_type="application/json", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content
    return response.json()


async def reproduce(token: str, request_id: str):
    return await AsyncClient().post(f"/v1/reproduce/{request_id}", headers={"Authorization": f"Bearer {token}"})


async def test_an_unseeded_sampled_api_reply_reproduces_identical_after_a_restart(users):
    _, token = users["rhea"]
    reply = await completion(token, temperature=0.8, logprobs=True, top_logprobs=2)  # no seed, on purpose
    answer = await reproduce(token, reply["id"])
    assert answer.status_code == 200, answer.content
    assert answer.json()["identical"] is True and answer.json()["first_difference"] is None
    kept = await ReproduceRecord.objects.aget(request_id=reply["id"])
    assert isinstance(kept.record["params"]["seed"], int) and kept.record["params"]["temperature"] == 0.8
    await asyncio.to_thread(bridge.shutdown)  # the engine goes; the next request starts a new one
    again = await reproduce(token, reply["id"])
    assert again.status_code == 200 and again.json()["identical"] is True
    assert again.json()["reproduced_digest"] == kept.record["digest"]


@inprocess_only
async def test_another_users_reproduce_is_the_404_of_an_unknown_id(users, settings):
    (_, owner), (mallory, stranger) = users["rhea"], users["mallory"]
    reply = await completion(owner, temperature=0.8, seed=5)
    unknown = await reproduce(stranger, "chatcmpl-0000")
    foreign = await reproduce(stranger, reply["id"])
    assert unknown.status_code == foreign.status_code == 404
    assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"] == "not_found"
    assert not await ReproduceRecord.objects.filter(user=mallory).aexists()
    assert (await reproduce(owner, reply["id"])).status_code == 200, "liveness: the owner's own is found"
    settings.WORKBENCH_REPRODUCE_RETENTION_S = 1e-6
    assert (await reproduce(owner, reply["id"])).status_code == 404, "past its retention a record is gone"


@inprocess_only
async def test_an_unseeded_chat_reply_reproduces_identical_for_its_owner_only(users):
    (rhea, _), (mallory, _) = users["rhea"], users["mallory"]
    conversation = await sync_to_async(Conversation.objects.create)(owner=rhea)
    ws = WebsocketCommunicator(as_user(rhea), f"/ws/chat/{conversation.pk}")
    assert (await ws.connect())[0]
    frames = await talk(ws, {"type": "send", "content": "What is a list?",  # sampled, no seed: on purpose
                             "params": {"temperature": 0.8, "max_tokens": 10}})
    await ws.disconnect()
    message_id = frames[-1]["message_id"]
    stored = await Message.objects.aget(pk=message_id)
    assert isinstance(stored.reproduce["params"]["seed"], int)
    path = f"/c/{conversation.pk}/replies/{message_id}/reproduce"
    client = AsyncClient()
    await client.aforce_login(mallory)
    assert (await client.post(path)).status_code == 404
    await client.aforce_login(rhea)
    answer = await client.post(path)
    assert answer.status_code == 200 and answer.json()["identical"] is True, answer.content
    await asyncio.to_thread(bridge.shutdown)
    assert (await client.post(path)).json()["identical"] is True


async def audit_counts() -> dict[str, float]:
    samples = await scrape()
    return {name: total(samples, f"workbench_replay_audit{name}_total") for name in ("ed", "_equal", "_mismatched")}


async def audited(requests: int, before: dict[str, float]) -> dict[str, float]:
    """The counts once `requests` more have been audited (the audit runs while the engine is idle)."""
    async def counts() -> dict[str, float] | None:
        now = await audit_counts()
        return now if now["ed"] - before["ed"] >= requests else None
    for _ in range(600):
        if (now := await counts()) is not None:
            return {k: now[k] - before[k] for k in now}
        await asyncio.sleep(0.1)
    raise AssertionError(f"{requests} audits did not finish: {await audit_counts()}")


async def batch(user: str, n: int) -> None:
    """n seeded sampled requests handed to the engine at once, so that it batches them (more than 3 rows).
    Straight through the serving layer: the test client's HTTP requests reach it one after another."""
    transport = await asyncio.to_thread(bridge.transport)
    streams = [limits.admit(user).submit(transport, f"batch-{uuid.uuid4().hex}", [5, 9, 14, 3 + i],
                                         SamplingParams(max_tokens=16, temperature=0.8, seed=40 + i, logprobs=2,
                                                        ignore_eos=True), "demo") for i in range(n)]
    for stream in streams:
        async for _ in stream:
            pass


@inprocess_only
async def test_the_audit_counts_equal_reruns_and_catches_the_batched_row_mutant(users, monkeypatch):
    from workbench.ops.models import LeakEvent

    transport = await asyncio.to_thread(bridge.transport)
    [was] = [flags["ARC_REPLAY_AUDIT_PERMILLE"] for flags in transport.flags_in_force().values()]
    await transport.change_flag("ARC_REPLAY_AUDIT_PERMILLE", 1000)
    try:
        # The liveness control: the same batch without the mutant, every re-run equal.
        before = await audit_counts()
        await batch("rhea", 5)
        counted = await audited(5, before)
        assert counted == {"ed": 5, "_equal": 5, "_mismatched": 0}

        real_sample, fired = runner.sample, []

        def mutant(logits: torch.Tensor, rows):
            if logits.shape[0] > 3:  # the last bit of row 0's logits, only in a batch of more than 3
                fired.append(logits.shape[0])
                logits = logits.clone()
                logits[0] = (logits[0].float().contiguous().view(torch.int32) ^ 1).view(torch.float32).to(logits.dtype)
            return real_sample(logits, rows)

        monkeypatch.setattr(runner, "sample", mutant)
        before = await audit_counts()
        await batch("rhea", 5)
        counted = await audited(5, before)
        assert fired, "liveness: the batch had more than 3 rows at some step"
        assert counted["_mismatched"] >= 1 and counted["_equal"] + counted["_mismatched"] == 5
        event = await async_wait_until(
            lambda: LeakEvent.objects.filter(kind="replay_mismatch").first(), timeout=30,
            what="the mismatch stored as a leak event")
        assert "re-run alone differs at output token" in event.message
    finally:
        await transport.change_flag("ARC_REPLAY_AUDIT_PERMILLE", was)


@inprocess_only
async def test_only_the_routes_whose_replies_name_the_id_keep_a_record(users):
    """A record is kept for POST /v1/reproduce to take the reply's id: the Messages and Responses routes
    name other ids, so they keep none (a Responses request with store: false expects nothing kept)."""
    user, token = users["rhea"]
    headers = {"Authorization": f"Bearer {token}"}
    for path, body in (("/v1/messages", {"model": "demo", "messages": MESSAGES, "max_tokens": 4}),
                       ("/v1/responses", {"model": "demo", "input": "Hi", "max_output_tokens": 4, "store": False})):
        response = await AsyncClient().post(path, json.dumps({**body, "temperature": 0.0}),
                                            content_type="application/json", headers=headers)
        assert response.status_code == 200, (path, response.content)
    reply = await completion(token, temperature=0.0)
    assert (await reproduce(token, reply["id"])).status_code == 200, "liveness: a chat completion's record is kept"
    await asyncio.sleep(0.5)  # the other routes' writes, had they been made, landed by now
    kept = [r async for r in ReproduceRecord.objects.filter(user=user).values_list("request_id", flat=True)]
    assert kept == [reply["id"]], kept
