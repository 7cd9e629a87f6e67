"""Schedulers: which sequences run in the next forward, and who holds which KV blocks.

`paged` (the default): blocks on demand, preemption by recompute or swap, continuous batching.
`default`: one length bucket per step with an urgency waitlist; blocks reserved at admission.
"""

from engine.kv_cache import PagedKVCache
from engine.scheduler.base import ScheduledBatch, SchedulerBase, SchedulerLimits
from engine.scheduler.default import DefaultScheduler
from engine.scheduler.paged import PagedScheduler

SCHEDULERS = ("paged", "default")


def make_scheduler(name: str, kv_cache: PagedKVCache, limits: SchedulerLimits, swap_blocks: int = 0) -> SchedulerBase:
    if name == "paged":
        return PagedScheduler(kv_cache, limits, swap_blocks)
    if name == "default":
        return DefaultScheduler(kv_cache, limits)
    raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")


__all__ = ["DefaultScheduler", "PagedScheduler", "ScheduledBatch", "SchedulerBase", "SchedulerLimits",
           "SCHEDULERS", "make_scheduler"]
