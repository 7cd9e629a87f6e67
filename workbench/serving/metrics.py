"""One engine's serving metrics, kept by the thread that owns it and read anywhere as a plain snapshot.

EngineHost (engine_host.py) feeds every output to `observe` and takes a `snapshot` of the engine's
stats (Engine.stats()) after each step; a Celery worker sends its snapshot in its heartbeat, so the web
side's /metrics (workbench/ops/metrics.py) can show every worker without reaching into any engine.
Histograms are bucket counts and a sum; /metrics accumulates them as Prometheus keeps them.
MetricsSnapshot is that snapshot's shape, the contract between the engine's side and /metrics.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # annotations only: the web process that counts requests loads no model code
    from engine.host.stats import EngineStats
    from engine.outputs import RequestOutput

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class HistogramSnapshot(TypedDict):
    bounds: list[float]  # each bucket's upper bound
    counts: list[int]  # per bucket, the last for +Inf (one more than bounds)
    sum: float


class MetricsSnapshot(TypedDict):
    """One engine's serving metrics: gauges as of its last step, counters since it started."""
    running: int
    waiting: int
    kv_cache_usage: float
    prefix_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    finished: dict[str, int]  # finished requests by finish_reason
    device_loop_bursts: int
    parked_tokens_dropped: int
    replay_max_delta: float
    ttft: HistogramSnapshot
    itl: HistogramSnapshot
    # The replay audit's counts (engine/host/replay_audit.py): re-runs compared, bit-equal, mismatched
    # on a bit-invariant route (leak events), differed on a route that promises no bits, dropped unrun.
    replay_audited: int
    replay_audit_equal: int
    replay_audit_mismatched: int
    replay_audit_differed: int
    replay_audit_dropped: int


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times

    def snapshot(self) -> HistogramSnapshot:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.total}


class EngineMetrics:
    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self._last_delta: dict[str, float] = {}

    def observe(self, output: RequestOutput) -> None:
        now, tokens = time.monotonic(), len(output.token_ids)
        self.generation_tokens += tokens
        last = self._last_delta.get(output.request_id)
        if last is not None and tokens:
            self.itl.observe((now - last) / tokens, tokens)  # a delta's gap, shared by its tokens
        if tokens:
            self._last_delta[output.request_id] = now
        if output.finished:
            self._last_delta.pop(output.request_id, None)
            self.finished[output.finish_reason or "error"] += 1
            if output.usage:
                self.prompt_tokens += output.usage.prompt_tokens
            ttft = (output.timings or {}).get("time_to_first_token")
            if ttft is not None:
                self.ttft.observe(ttft)

    def failed(self, request_id: str) -> None:
        """A request ended by a failed step: it produced no last output to observe."""
        self._last_delta.pop(request_id, None)
        self.finished["error"] += 1

    def snapshot(self, stats: EngineStats, audit: Mapping[str, int] | None = None) -> MetricsSnapshot:
        """Counters and gauges as of `stats` (the engine's, taken on its thread just now), `audit` (the
        replay audit's counts) and this."""
        audit = audit or {}
        return {
            "running": stats.running, "waiting": stats.waiting,
            "kv_cache_usage": stats.kv_cache_usage,
            "prefix_cache_usage": stats.prefix_cache_usage,
            "prefix_cache_queries": stats.prefix_cache_queries, "prefix_cache_hits": stats.prefix_cache_hits,
            "preemptions": stats.preemptions,
            "prompt_tokens": self.prompt_tokens, "generation_tokens": self.generation_tokens,
            "finished": dict(self.finished),
            "device_loop_bursts": stats.device_loop_bursts,
            "parked_tokens_dropped": stats.parked_tokens_dropped,
            "replay_max_delta": stats.replay_max_delta,
            "ttft": self.ttft.snapshot(), "itl": self.itl.snapshot(),
            "replay_audited": audit.get("replay_audited", 0),
            "replay_audit_equal": audit.get("replay_audit_equal", 0),
            "replay_audit_mismatched": audit.get("replay_audit_mismatched", 0),
            "replay_audit_differed": audit.get("replay_audit_differed", 0),
            "replay_audit_dropped": audit.get("replay_audit_dropped", 0),
        }
