"""A Celery GPU worker with fault hooks, for the fault-injection tests (tests/workbench/test_faults.py).

    celery -A tests.fault_worker worker --pool solo ...

It is the workbench's own worker (workbench/celery.py, imported whole: same signals, same engine host),
with hooks that the engine has no switch for, set from the environment at start:

- FAULT_POISON: a forward raises whenever its batch holds a sequence whose prompt contains this text
  (a row whose input breaks the forward: a bad kernel input, a device assert), so the others in the
  batch see what a real forward error does to them;
- FAULT_KV_BLOCKS: the KV pool's size in blocks, small enough for a preemption storm;
- FAULT_STEP_S: seconds every engine step takes at least, as on a slower device: the fault tests need
  requests still decoding when they look (in a heartbeat) and then strike, which the demo model on a
  fast CPU finishes first;
- FAULT_STALL (with FAULT_STALL_S): the first forward of a sequence whose prompt contains this text
  keeps the engine thread busy for FAULT_STALL_S in Python (a step that outlasts several heartbeats:
  a huge prefill, a graph capture, a slow device), for the liveness tests
  (tests/workbench/test_worker_liveness.py).

Test code only: nothing in workbench/ or engine/ imports it.
"""

from __future__ import annotations

import os
import time

from engine.decode.runner import ModelRunner
from engine.engine_config import EngineConfig
from workbench.celery import app

__all__ = ["app"]

POISON = os.environ.get("FAULT_POISON", "")
KV_BLOCKS = int(os.environ.get("FAULT_KV_BLOCKS", "0"))
STALL = os.environ.get("FAULT_STALL", "")
STALL_S = float(os.environ.get("FAULT_STALL_S", "0"))
STEP_S = float(os.environ.get("FAULT_STEP_S", "0"))


class PoisonedForward(RuntimeError):
    """The injected forward error."""


if POISON:
    _forward = ModelRunner.forward

    def _poisoned_forward(self, seqs, *chunking):  # chunking: each row's feeds and which rows sample
        tokenizer = self.loaded.tokenizer
        if any(POISON in tokenizer.decode(seq.prompt_ids) for seq in seqs):
            raise PoisonedForward(f"injected: a row's prompt holds {POISON!r}")
        return _forward(self, seqs, *chunking)

    ModelRunner.forward = _poisoned_forward

if KV_BLOCKS:
    _from_env = EngineConfig.from_env.__func__

    def _small_pool(cls, **overrides):
        return _from_env(cls, **{**overrides, "num_kv_blocks": KV_BLOCKS})

    EngineConfig.from_env = classmethod(_small_pool)

if STALL:
    _unstalled_forward = ModelRunner.forward
    _stalled: set[int] = set()

    def _stalling_forward(self, seqs, *chunking):
        tokenizer = self.loaded.tokenizer
        fresh = [seq for seq in seqs if seq.seq_id not in _stalled and STALL in tokenizer.decode(seq.prompt_ids)]
        if fresh:
            _stalled.update(seq.seq_id for seq in fresh)
            print(f"stalling the step for {STALL_S} s", flush=True)
            # Busy in Python, not asleep: the engine thread wants the GIL all along, as a step's own
            # Python work does; a heartbeat written from this thread's loop would wait for it to end.
            end = time.monotonic() + STALL_S
            while time.monotonic() < end:
                sum(range(1000))
            print("stall over", flush=True)
        return _unstalled_forward(self, seqs, *chunking)

    ModelRunner.forward = _stalling_forward

if STEP_S:
    _run = ModelRunner.run

    def _slow_run(self, batch, requests):  # every step, bursts' and parked tokens' included
        time.sleep(STEP_S)
        return _run(self, batch, requests)

    ModelRunner.run = _slow_run
