"""A serving process freezes what start-up and each engine's loading left alive (workbench/serving/heap.py),
a process that does not serve freezes nothing, and the served web process's /metrics shows it.

The freezing cases run in a fresh interpreter each: a frozen object stays frozen for the life of the
process, which must not be the test process's."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]

# Each case prints what it measured; a fresh interpreter starts with nothing frozen.
NOT_SERVING = """
from workbench.serving import heap
kept = [[n] for n in range(50_000)]
heap.after_load()
print(heap.frozen())
"""
SERVING = """
import gc
from workbench.serving import heap
heap.serving_process()
at_start = heap.frozen()
kept = [[n] for n in range(50_000)]  # what an engine's loading leaves alive
heap.after_load()
loaded = heap.frozen()
for _ in range(3):
    cycle = []
    cycle.append(cycle)  # garbage only a pass can free
    gc.collect()
print(at_start, loaded - at_start, heap.passes().count, gc.collect())
"""


def run(script: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [int(field) for field in out.split()]


def test_a_process_that_does_not_serve_freezes_nothing_when_an_engine_loads():
    assert run(NOT_SERVING) == [0]


def test_a_serving_process_freezes_start_up_and_each_load_and_counts_the_full_passes_after():
    at_start, from_the_load, passes, still_collectable = run(SERVING)
    assert at_start > 1_000  # the interpreter's own modules and what the import brought
    assert from_the_load >= 50_000
    assert passes == 4  # every full pass after serving began: the load's freeze and the three
    assert still_collectable == 0  # the passes still collect what was made after the freeze


def test_the_served_web_process_has_frozen_its_start_up(inprocess_daphne):
    with urllib.request.urlopen(f"http://{inprocess_daphne.address}/metrics", timeout=30) as response:
        samples = {sample.name: sample.value for family in text_string_to_metric_families(response.read().decode())
                   for sample in family.samples}
    # Django, the application and everything they import: about 250,000 objects before any engine loads.
    assert samples["workbench_web_gc_frozen_objects"] > 100_000
    assert {"workbench_web_gc_full_passes_total", "workbench_web_gc_full_pass_seconds_total"} <= samples.keys()
