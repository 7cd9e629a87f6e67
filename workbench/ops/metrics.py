"""Prometheus `/metrics`: every worker's serving metrics, labelled by worker, as prometheus-client text.

The numbers are kept where the engine runs (workbench/serving/metrics.py) and reach this process as
snapshots (in-process directly, Celery workers through their heartbeats), so each scrape renders
what the transport last heard; a worker that is gone drops out of the scrape. Beside them, unlabelled,
the garbage collector's figures of the web process that answers (workbench/serving/heap.py).

With WORKBENCH_METRICS_TOKEN set, a scrape must send it (`Authorization: Bearer <token>`, compared in
constant time): without it, or with another, the answer is 401 and no numbers. Unset, /metrics is open,
as most scrape targets are (docs/OPERATIONS.md, "Watching it").
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from workbench.api.auth import bearer_token
from workbench.serving import bridge, heap

GAUGES = {"running": ("workbench_requests_running", "Requests the engine is running"),
          "waiting": ("workbench_requests_waiting", "Requests waiting for the engine"),
          "kv_cache_usage": ("workbench_kv_cache_usage_ratio", "Share of the KV cache's blocks in use"),
          "prefix_cache_usage": ("workbench_prefix_cache_usage_ratio",
                                 "Share of the KV cache's blocks holding a cached prompt prefix"),
          "replay_max_delta": ("workbench_replay_verification_max_delta",
                               "Max |replay - eager| of the last verified graph replay")}
COUNTERS = {"preemptions": ("workbench_preemptions", "Sequences preempted for room in the KV cache"),
            "prompt_tokens": ("workbench_prompt_tokens", "Prompt tokens of finished requests"),
            "generation_tokens": ("workbench_generation_tokens", "Tokens generated"),
            "device_loop_bursts": ("workbench_device_loop_bursts", "Device-loop bursts decoded"),
            # Tokens, as vLLM counts them: prompt tokens looked up at admission, and those found cached.
            "prefix_cache_queries": ("workbench_prefix_cache_queries", "Prompt tokens looked up in the prefix cache"),
            "prefix_cache_hits": ("workbench_prefix_cache_hits", "Prompt tokens found in the prefix cache"),
            "parked_tokens_dropped": ("workbench_parked_tokens_dropped",
                                      "Parked tokens dropped because their owner did not match"),
            "replay_audited": ("workbench_replay_audited", "Finished requests the replay audit re-ran alone"),
            "replay_audit_equal": ("workbench_replay_audit_equal", "Audited re-runs equal to the record, bit for bit"),
            "replay_audit_mismatched": ("workbench_replay_audit_mismatched",
                                        "Audited re-runs that differ on a bit-invariant route (leak events)"),
            "replay_audit_differed": ("workbench_replay_audit_differed",
                                      "Audited re-runs that differ on a route that promises no bits"),
            "replay_audit_dropped": ("workbench_replay_audit_dropped",
                                     "Audits dropped unrun from a full queue")}
HISTOGRAMS = {"ttft": ("workbench_time_to_first_token_seconds", "Time to first token"),
              "itl": ("workbench_inter_token_latency_seconds", "Time between tokens")}


class WorkersCollector:
    def __init__(self, by_worker: Mapping[str, Mapping[str, Any]]) -> None:
        """`by_worker`: each worker's MetricsSnapshot (workbench/serving/metrics.py), read by key with a
        default, so that a worker of another version that sends fewer keys still renders."""
        self.by_worker = by_worker

    def collect(self):
        for key, (name, doc) in GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=["worker"])
            for worker, metrics in self.by_worker.items():
                family.add_metric([worker], metrics.get(key, 0))
            yield family
        for key, (name, doc) in COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=["worker"])
            for worker, metrics in self.by_worker.items():
                counter.add_metric([worker], metrics.get(key, 0))
            yield counter
        finished = CounterMetricFamily("workbench_requests_finished", "Finished requests by finish_reason",
                                       labels=["worker", "finish_reason"])
        for worker, metrics in self.by_worker.items():
            for reason, count in sorted(metrics.get("finished", {}).items()):
                finished.add_metric([worker, reason], count)
        yield finished
        for key, (name, doc) in HISTOGRAMS.items():
            histograms = HistogramMetricFamily(name, doc, labels=["worker"])
            for worker, metrics in self.by_worker.items():
                histogram = metrics.get(key)
                if histogram:
                    histograms.add_metric([worker], _cumulative(histogram), histogram["sum"])
            yield histograms


class WebProcessCollector:
    """The collector of the process that answers the scrape (workbench/serving/heap.py): what start-up
    froze, and the full passes since, which stall whichever thread set them off."""

    def collect(self):
        yield GaugeMetricFamily("workbench_web_gc_frozen_objects",
                                "Objects this web process froze out of the garbage collector's passes", value=heap.frozen())
        passes = heap.passes()
        yield CounterMetricFamily("workbench_web_gc_full_passes", "Full garbage-collector passes in this web process "
                                  "since it began serving", value=passes.count)
        yield CounterMetricFamily("workbench_web_gc_full_pass_seconds", "Seconds those passes took", value=passes.seconds)


def _cumulative(histogram: Mapping[str, Any]) -> list[tuple[str, int]]:
    buckets, running = [], 0
    for bound, count in zip([*map(str, histogram["bounds"]), "+Inf"], histogram["counts"]):
        running += count
        buckets.append((bound, running))
    return buckets


def _scrape_refusal(request: HttpRequest) -> HttpResponse | None:
    """401 for a scrape without the configured token (None: it may read, or no token is configured)."""
    expected = settings.WORKBENCH_METRICS_TOKEN
    if not expected:
        return None
    sent = bearer_token(request.headers)
    if sent is not None and hmac.compare_digest(sent.encode(), expected.encode()):
        return None
    refused = HttpResponse("/metrics needs this deployment's metrics token: Authorization: Bearer <token>\n",
                           status=401, content_type="text/plain; charset=utf-8")
    refused["WWW-Authenticate"] = 'Bearer realm="metrics"' + ("" if sent is None else ', error="invalid_token"')
    return refused


async def metrics(request: HttpRequest) -> HttpResponse:
    refused = _scrape_refusal(request)
    if refused is not None:
        return refused
    # A scrape starts nothing: before the first request has started the transport there is no worker.
    transport = bridge.running()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector(transport.metrics_by_worker() if transport else {}))
    registry.register(WebProcessCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
