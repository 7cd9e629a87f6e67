"""The reference a request is held to: the tokens it gets when it runs alone.

Request independence (docs/ARCHITECTURE.md) says a request's tokens must not depend on what else runs,
so every test that batches, serves, interrupts or replays requests compares each answer with its solo
run. `solo` runs one prompt on an engine of its own built for the call; `greedy_solo` is the served
tests' reference, a greedy run of the demo model (what the workbench serves), kept per process.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from pathlib import Path

from engine import Engine, EngineConfig, SamplingParams

_DEMO_LOCK = threading.Lock()  # callers on several threads (the fuzzer, the fault stack) share one engine
_SOLO: dict[tuple[str, int], tuple[int, ...]] = {}  # (prompt, max_tokens): its greedy tokens, kept per process


def solo(model: str | Path, prompt: str | list[int], params: SamplingParams, **config) -> list[int]:
    """`prompt`'s tokens run alone on a fresh engine of `model` built with `config`."""
    return Engine(EngineConfig(model=str(model), **config)).generate([prompt], params)[0].token_ids


def greedy_solo(prompt: str, max_tokens: int) -> list[int]:
    """A greedy request's tokens (EOS ignored, so exactly `max_tokens`) run alone on the demo model:
    what it must get from a server of the demo model, on any transport. A new list per call."""
    return greedy_solos([prompt], max_tokens)[0]


def greedy_solos(prompts: Sequence[str], max_tokens: int) -> list[list[int]]:
    """`greedy_solo` of each prompt, those not yet known run in one batch: a request's tokens do not
    depend on what runs beside it (tests/engine/test_batch_invariance.py holds the engine to that), and
    sixteen prompts of 120 tokens took 0.8 s batched against 5.5 s one by one here."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    with _DEMO_LOCK:
        unknown = [prompt for prompt in dict.fromkeys(prompts) if (prompt, max_tokens) not in _SOLO]
        if unknown:
            for prompt, result in zip(unknown, _demo_engine().generate(unknown, params)):
                _SOLO[prompt, max_tokens] = tuple(result.token_ids)
        return [list(_SOLO[prompt, max_tokens]) for prompt in prompts]


@functools.cache
def _demo_engine() -> Engine:
    return Engine(EngineConfig(model="demo"))
