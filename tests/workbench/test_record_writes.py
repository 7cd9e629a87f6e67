"""A Celery web process keeps its API requests' reproducibility records whichever request started its
transport.

Django runs a sync-only middleware (WhiteNoise's) on a thread and the async view under it through
asgiref's AsyncToSync, whose executor lives as long as that request. The transport starts the first time
a request needs it; the Celery link loop's tasks, which deliver every request's last event (and so hand
its record to be written), ran in a copy of that first request's context, asgiref's executor included,
and every record written from there after that request failed ("CurrentThreadExecutor already quit or is
broken", in the shared Celery Daphne's log). The transport now starts in a context of its own
(workbench/serving/bridge.py)."""

from __future__ import annotations

import asyncio

import pytest
from django.conf import settings
from django.test import AsyncClient

from engine import SamplingParams
from workbench.api import reproduce_records
from workbench.serving import bridge, limits

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_a_record_is_kept_after_the_request_that_started_the_transport_is_over(api_user, celery_cluster):
    saved = settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX
    await asyncio.to_thread(bridge.shutdown)
    settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX = "celery", celery_cluster.prefix
    try:
        # The first request that needs the transport starts it (GET /v1/models asks for the served
        # models), through Django's whole middleware stack; it is over from here on.
        listed = await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {api_user[1]}"})
        assert listed.status_code == 200, listed.content
        transport = bridge.running()
        for _ in range(300):  # the roster's first poll
            if transport.answering():
                break
            await asyncio.sleep(0.05)
        stream = limits.admit("alice").submit(transport, "kept-1", "The list type",
                                              SamplingParams(max_tokens=4, temperature=0))
        events = [event async for event in stream]
        assert events[-1].finish_reason == "length", events[-1]
        record = await reproduce_records.record_of(api_user[0], "kept-1")
        assert record is not None, "the record was not written (the web process's log says why)"
        assert record.record == events[-1].reproduce
    finally:
        settings.WORKBENCH_TRANSPORT, settings.WORKBENCH_QUEUE_PREFIX = saved
        await asyncio.to_thread(bridge.shutdown)
