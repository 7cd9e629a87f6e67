"""CUDA-event timing for the GPU benchmarks: the median of several calls, each timed on the device."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def median_ms(run: Callable[[], object], repeats: int) -> float:
    """The median over `repeats` calls of `run`, in milliseconds, after one untimed call (compiled and
    warm before the clock starts)."""
    run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
