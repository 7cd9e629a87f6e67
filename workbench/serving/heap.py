"""Short full passes of the garbage collector in a serving process: what start-up loaded, frozen.

CPython's collector walks every object it tracks on a full (generation 2) pass, and the thread whose
allocation set it off waits for it. A served process tracks about 310,000 objects once Django, torch
and an engine are loaded, nearly all of them kept until the process ends: one full pass took 90-120 ms
on an idle server and 157-190 ms in a busy one (one or two a minute at 32 clients), each an inter-token
gap for every stream or a stalled engine step. gc.freeze() moves every object alive now
out of the collector's sight for good, as vLLM's engine core does after it starts; later full passes
walk only what was allocated since.

Frozen objects are never collected, so only a process that serves freezes, once it has started
(serving_process: workbench/serve.py, the Celery worker) and again once each engine has loaded
(after_load: the engine host). A test process that builds and drops engines by the hundred would keep
every one it dropped that sits in a reference cycle, so there after_load does nothing.

The passes that remain are counted (passes(): the web process's /metrics shows them), so an operator
can see whether the collector still stalls the server.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

_serving = False
_started_at = 0.0


@dataclass
class FullPasses:
    """The full passes since the process began serving, and the seconds they took."""
    count: int = 0
    seconds: float = 0.0


_passes = FullPasses()


def serving_process() -> None:
    """Marks this process as one that serves, freezes what it has loaded so far, and starts counting
    the full passes that remain. Idempotent."""
    global _serving
    freeze()
    if not _serving:
        _serving = True
        gc.callbacks.append(_time_full_passes)


def after_load() -> None:
    """Freezes what an engine's loading left alive, in a process that serves; elsewhere nothing."""
    if _serving:
        freeze()


def freeze() -> None:
    gc.collect()  # what start-up left as garbage goes now, not into the frozen set
    gc.freeze()


def frozen() -> int:
    return gc.get_freeze_count()


def passes() -> FullPasses:
    return FullPasses(_passes.count, _passes.seconds)


def _time_full_passes(phase: str, info: dict[str, int]) -> None:
    global _started_at
    if info["generation"] != 2:
        return
    if phase == "start":
        _started_at = time.perf_counter()
    else:
        _passes.count += 1
        _passes.seconds += time.perf_counter() - _started_at
