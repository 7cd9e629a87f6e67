"""Schedulers: which sequences run in the next forward, and who holds which KV blocks.

`paged` (the default): blocks on demand, preemption by recompute or swap, continuous batching.
`bucket`: one length bucket per step with an urgency waitlist; blocks reserved at admission.
"""

from engine.scheduler.base import Lookahead, SchedulerBase, SchedulerLimits
from engine.scheduler.bucket import BucketScheduler
from engine.scheduler.kv_cache import PagedKVCache
from engine.scheduler.paged import PagedScheduler
from engine.step_data import ScheduledBatch

SCHEDULERS = ("paged", "bucket")


def make_scheduler(name: str, kv_cache: PagedKVCache, limits: SchedulerLimits, swap_blocks: int = 0,
                   lookahead: Lookahead | None = None, prefix_caching: bool = True) -> SchedulerBase:
    """`lookahead`: the burst a batch would run (the device loop's), which the scheduler grants KV room for.
    `prefix_caching`: admissions take cached prefix blocks, and full blocks are kept cached."""
    if name == "paged":
        return PagedScheduler(kv_cache, limits, swap_blocks, lookahead, prefix_caching)
    if name == "bucket":
        return BucketScheduler(kv_cache, limits, lookahead, prefix_caching)
    raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")


__all__ = ["BucketScheduler", "Lookahead", "PagedScheduler", "ScheduledBatch", "SchedulerBase", "SchedulerLimits",
           "SCHEDULERS", "make_scheduler"]
