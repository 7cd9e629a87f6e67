"""Stored /v1/responses replies: DELETE /v1/responses/{id} by its own user only (the official `openai` SDK's
`responses.delete` against the shared in-process Daphne), and the retention period that expires them
(workbench/api/responses/store.py, on the test database)."""

from __future__ import annotations

import time
from datetime import timedelta

import openai
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.users import unique_name
from tests.workbench.daphne_session import Session
from workbench.api.http_api import ApiError
from workbench.api.models import StoredResponse
from workbench.api.responses import store

SEEDED = dict(temperature=1.0, extra_body={"seed": 4})  # every sampled request here is seeded


def test_a_stored_reply_is_deleted_by_its_own_user_only(inprocess_daphne):
    def client() -> openai.OpenAI:
        _, token = Session(inprocess_daphne.address).sign_up(unique_name("stored")).new_token("sdk")
        return openai.OpenAI(base_url=f"http://{inprocess_daphne.address}/v1", api_key=token, max_retries=0)

    owner, other = client(), client()
    kept = owner.responses.create(model="demo", input="Hi", max_output_tokens=2, **SEEDED)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(kept.id)
    assert owner.responses.retrieve(kept.id).id == kept.id, "another user's delete changed nothing"
    owner.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        owner.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        owner.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError) as caught:
        owner.responses.create(model="demo", previous_response_id=kept.id, input="More", max_output_tokens=2, **SEEDED)
    assert caught.value.body["param"] == "previous_response_id"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_reply_past_the_retention_period_is_not_found_and_is_deleted_at_the_next_store(settings, monkeypatch):
    settings.WORKBENCH_RESPONSES_RETENTION_DAYS = 30
    user = await get_user_model().objects.acreate(username=unique_name("retention"))
    await store.save(user, {"id": "resp_old"}, [])
    await store.save(user, {"id": "resp_recent"}, [])
    await StoredResponse.objects.filter(response_id="resp_old").aupdate(created_at=timezone.now() - timedelta(days=31))
    await StoredResponse.objects.filter(response_id="resp_recent").aupdate(
        created_at=timezone.now() - timedelta(days=29))
    with pytest.raises(ApiError):
        await store.response_of(user, "resp_old")
    with pytest.raises(ApiError):
        await store.delete(user, "resp_old")
    assert (await store.response_of(user, "resp_recent"))["id"] == "resp_recent"
    assert await StoredResponse.objects.filter(response_id="resp_old").aexists(), "read as gone, not yet deleted"
    await store.save(user, {"id": "resp_new"}, [])
    assert await StoredResponse.objects.filter(response_id="resp_old").aexists(), "purged at most once a minute"
    monkeypatch.setattr(store, "_purged_at", [time.monotonic() - store.PURGE_EVERY_S])  # a minute on
    await store.save(user, {"id": "resp_newer"}, [])
    left = {r async for r in StoredResponse.objects.values_list("response_id", flat=True)}
    assert left == {"resp_recent", "resp_new", "resp_newer"}, "the store deleted the expired reply, and only it"

    settings.WORKBENCH_RESPONSES_RETENTION_DAYS = 0  # kept until deleted
    await StoredResponse.objects.filter(response_id="resp_recent").aupdate(
        created_at=timezone.now() - timedelta(days=3650))
    assert (await store.response_of(user, "resp_recent"))["id"] == "resp_recent"
