"""EngineStats: the counts an engine's host reads after each step, as one immutable value.

The serving layer (workbench/serving) reports load, heartbeats and Prometheus metrics from these, so
it never reads the scheduler, the KV pool, the device loop or the replay records itself: `stats_of` does,
for `Engine.stats()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.decode.device_loop import DeviceLoop
from engine.decode.graphs import DecodeGraphs
from engine.scheduler import SchedulerBase
from engine.scheduler.kv_cache import PagedKVCache


@dataclass(frozen=True)
class EngineStats:
    running: int  # sequences in the scheduler's running set
    waiting: int  # sequences queued for admission
    kv_cache_usage: float  # fraction of the KV pool's blocks in use, 0..1
    preemptions: int  # since the engine started
    device_loop_bursts: int  # since the engine started
    parked_tokens_dropped: int  # foreign parked tokens the owner tag dropped, since the engine started
    prefix_cache_usage: float  # fraction of the KV pool's blocks holding a cached prefix (held or idle), 0..1
    prefix_cache_queries: int  # prompt tokens looked up at admission, since the engine started (as vLLM counts)
    prefix_cache_hits: int  # of those, tokens found cached
    replay_max_delta: float  # the latest replay check's max |delta| (0.0 before any; NaN for non-finite logits)


def stats_of(kv_cache: PagedKVCache, scheduler: SchedulerBase, device_loop: DeviceLoop, graphs: DecodeGraphs) -> EngineStats:
    """An engine's counts as of now, read from its parts; on the engine's thread."""
    allocator, records = kv_cache.pool, graphs.verify.records
    return EngineStats(running=len(scheduler.running), waiting=len(scheduler.waiting),
                       kv_cache_usage=1 - allocator.num_free / allocator.num_blocks,
                       prefix_cache_usage=allocator.num_cached / allocator.num_blocks,
                       prefix_cache_queries=scheduler.prefix_queries, prefix_cache_hits=scheduler.prefix_hits,
                       preemptions=scheduler.num_preemptions, device_loop_bursts=device_loop.bursts,
                       parked_tokens_dropped=device_loop.parked.foreign_dropped,
                       replay_max_delta=records[-1].max_abs_delta if records else 0.0)
