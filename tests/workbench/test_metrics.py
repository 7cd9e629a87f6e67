"""/metrics over both transports: after a request, the generated tokens, the finish reason and the
time-to-first-token histogram count exactly that request, per worker, in Prometheus's text format."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from django.conf import settings
from django.test import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import async_wait_until
from tests.workbench.test_websocket_api import connect, frames_until_done
from workbench.serving import bridge


async def scrape() -> dict[tuple[str, tuple], float]:
    response = await AsyncClient().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode()) for sample in family.samples}


COUNTED = ("workbench_generation_tokens_total", "workbench_prompt_tokens_total", "workbench_requests_finished_total",
           "workbench_time_to_first_token_seconds_count", "workbench_inter_token_latency_seconds_count")


def total(samples: dict, name: str, **labels) -> float:
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items()))


async def settled_scrape(timeout: float = 30) -> dict[tuple[str, tuple], float]:
    """A scrape that an earlier test's requests no longer change: none running or waiting, and the
    counters this module checks the same over more than a heartbeat (a worker's numbers reach the web
    side with its next heartbeat, so a request that just ended elsewhere on a shared server can still add
    to the counters)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = await scrape()
        if not total(first, "workbench_requests_running") and not total(first, "workbench_requests_waiting"):
            await asyncio.sleep(1.5 * settings.WORKBENCH_HEARTBEAT_S)
            second = await scrape()
            if all(total(second, name) == total(first, name) for name in COUNTED):
                return first
        await asyncio.sleep(0.1)
    raise AssertionError(f"the metrics did not settle in {timeout} s")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("serving_transport")
async def test_a_request_is_counted_once_where_it_ran(api_user, serving_transport, request):
    await asyncio.to_thread(bridge.transport)
    workers = len(request.getfixturevalue("celery_cluster").workers) if serving_transport == "celery" else 1
    await async_wait_until(lambda: len(bridge.transport().metrics_by_worker()) == workers, timeout=30,
                           what=f"the metrics of all {workers} workers on the web side")
    before = await settled_scrape()
    workers = {dict(labels)["worker"] for name, labels in before if name == "workbench_requests_running"}
    assert workers == set(bridge.transport().metrics_by_worker()), "every worker is in the scrape"
    ws = await connect(api_user[1])
    await ws.send_to(text_data=json.dumps({"type": "generate", "request_id": "m", "prompt": "The list type",
                                           "params": {"max_tokens": 9, "temperature": 0, "ignore_eos": True}}))
    done = (await frames_until_done(ws, {"m"}))[-1]
    assert done["usage"]["completion_tokens"] == 9

    generated = "workbench_generation_tokens_total"
    for _ in range(50):  # a worker's numbers arrive with its next heartbeat
        after = await scrape()
        if total(after, generated) - total(before, generated) >= 9:
            break
        await asyncio.sleep(0.1)
    assert total(after, "workbench_generation_tokens_total") - total(before, "workbench_generation_tokens_total") == 9
    assert total(after, "workbench_prompt_tokens_total") - total(before, "workbench_prompt_tokens_total") == \
        done["usage"]["prompt_tokens"]
    assert total(after, "workbench_requests_finished_total", finish_reason="length") - \
        total(before, "workbench_requests_finished_total", finish_reason="length") == 1
    assert total(after, "workbench_time_to_first_token_seconds_count") - \
        total(before, "workbench_time_to_first_token_seconds_count") == 1
    assert total(after, "workbench_inter_token_latency_seconds_count") - \
        total(before, "workbench_inter_token_latency_seconds_count") == 8
    await ws.disconnect()


def test_a_value_on_a_bucket_bound_counts_in_that_bucket():
    """Prometheus's buckets are "less than or equal": 0.01 s belongs to le="0.01", not the next one."""
    from workbench.ops.metrics import _cumulative
    from workbench.serving.metrics import Histogram

    histogram = Histogram((0.005, 0.01, 0.025))
    for value in (0.005, 0.01, 0.0100001, 7.0):
        histogram.observe(value)
    assert _cumulative(histogram.snapshot()) == [("0.005", 1), ("0.01", 2), ("0.025", 3), ("+Inf", 4)]


@pytest.mark.parametrize("sent, status", [
    (None, 401), ("wb_not-it", 401), ("a-metrics-token-of-the-deploymenX", 401), ("é-not-ascii", 401),
    ("a-metrics-token-of-the-deployment", 200)])
def test_with_a_metrics_token_set_a_scrape_needs_it(client, settings, sent, status):
    settings.WORKBENCH_METRICS_TOKEN = "a-metrics-token-of-the-deployment"
    headers = {} if sent is None else {"HTTP_AUTHORIZATION": f"Bearer {sent}"}
    response = client.get("/metrics", **headers)
    assert response.status_code == status, response.content
    if status == 401:
        assert b"workbench_" not in response.content and response["WWW-Authenticate"].startswith("Bearer")
    else:
        assert b"# TYPE workbench_requests_running gauge" in response.content


@pytest.mark.parametrize("sent", [None, "anything"])
def test_without_a_metrics_token_metrics_stays_open(client, settings, sent):
    settings.WORKBENCH_METRICS_TOKEN = ""
    headers = {} if sent is None else {"HTTP_AUTHORIZATION": f"Bearer {sent}"}
    response = client.get("/metrics", **headers)
    assert response.status_code == 200 and b"# TYPE workbench_requests_running gauge" in response.content
