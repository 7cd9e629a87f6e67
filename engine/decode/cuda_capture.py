"""Capturing one decode step as a CUDA graph: warm-up on the capture stream, capture into a memory pool
shared by every bucket's graph, and a refusal that names what really went wrong.

`torch.cuda.graph` exits its stream context only after `capture_end()` returns; when the step raises
inside a capture, `capture_end()` raises too ("operation failed due to a previous error during
capture"), the capture stream stays the thread's current stream and the step's error survives only as
that exception's `__context__`. Here the stream is restored by its own `with` whatever happens, and
`root_cause` reads the chain back.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch


def capture(step: Callable[[], None], stream: torch.cuda.Stream, pool: tuple[int, int], device: torch.device,
            cuda: ModuleType) -> Callable[[], None]:
    """The replay of `step` captured on `stream` into `pool`; raises if capture fails, leaving the
    caller's current stream as it was. `cuda` is torch.cuda (tests pass a stand-in)."""
    caller = cuda.current_stream(device)
    stream.wait_stream(caller)
    with cuda.stream(stream):
        for _ in range(2):  # warm-up: allocator and kernel choices settle outside the graph
            step()
    caller.wait_stream(stream)
    cuda.synchronize(device)
    graph = cuda.CUDAGraph()
    with cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            step()
        finally:
            graph.capture_end()  # after a failed step this raises, with the step's error as __context__
    return graph.replay


def root_cause(exc: BaseException) -> str:
    """The exception in an operator's words, with the first error of its chain when that differs."""
    first = exc
    while (earlier := first.__cause__ or first.__context__) is not None:
        first = earlier
    said = f"{type(exc).__name__}: {exc}"
    return said if first is exc else f"{type(first).__name__}: {first} (then {said})"
