"""The engine's surface for a host (workbench/serving/engine_host.py): stats(), apply_flags(),
leak_events_since(). The serving layer reads the engine through these only, so each is checked against
what it reports on, with the waitlist interleave (docs/DEVICE_LOOP.md, the owner tag) as the source of real leak events."""

from __future__ import annotations

import dataclasses

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.decode.leak_events import FOREIGN_PARKED_DROPPED, LeakEventLog
from engine.host.stats import EngineStats

GREEDY = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=14, temperature=0.8, seed=3, ignore_eos=True)  # never bursts


@pytest.fixture
def interleaving_engine(tiny_checkpoint) -> Engine:
    """Two requests in different length buckets of the bucket scheduler: the owner tag drops tokens."""
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=11)), block_size=4, device_loop=True,
                                 burst_length=4, scheduler="bucket"))
    engine.add_request("A", list(range(100, 105)), GREEDY)
    engine.add_request("B", list(range(200, 212)), SAMPLED)
    return engine


def test_stats_count_what_the_engine_holds_and_did(interleaving_engine):
    engine = interleaving_engine
    before = engine.stats()
    assert (before.running, before.waiting, before.kv_cache_usage, before.device_loop_bursts) == (0, 2, 0.0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.running = 5  # type: ignore[misc]  # a value to hand to other threads: immutable
    engine.step()
    during = engine.stats()
    assert during.running + during.waiting == 2 and during.running >= 1
    assert 0 < during.kv_cache_usage <= 1, "the running sequences hold blocks"
    while engine.has_unfinished_requests():
        engine.step()
    after = engine.stats()
    assert (after.running, after.waiting, after.kv_cache_usage) == (0, 0, 0.0), "every block back in the pool"
    assert after.device_loop_bursts == engine.device_loop.bursts >= 2
    assert after.parked_tokens_dropped == engine.device_loop.parked.foreign_dropped > 0
    assert isinstance(after, EngineStats) and after.replay_max_delta == 0.0, "no replay check without graphs"


def test_leak_events_since_a_cursor_gives_each_event_once(interleaving_engine):
    engine = interleaving_engine
    assert engine.leak_events_since(0) == ([], 0), "liveness control: nothing before the interleave"
    seen, cursor = [], 0
    while engine.has_unfinished_requests():
        engine.step()
        fresh, cursor = engine.leak_events_since(cursor)
        seen += fresh
    assert seen and all(e.kind == FOREIGN_PARKED_DROPPED for e in seen)
    assert [e.number for e in seen] == list(range(1, len(seen) + 1)), "each event once, in order"
    assert sum(e.dropped for e in seen) == engine.stats().parked_tokens_dropped
    assert engine.leak_events_since(cursor) == ([], cursor)


def test_a_cursor_fallen_behind_gets_the_newest_kept_and_never_goes_back():
    log = LeakEventLog(keep=3)
    for n in range(5):
        log.record(FOREIGN_PARKED_DROPPED, f"drop {n}", dropped=1)
    events, cursor = log.since(0)
    assert [e.number for e in events] == [3, 4, 5] and cursor == 5
    assert log.since(9) == ([], 9), "a cursor from ahead (another engine's) is kept, not moved back"


def test_apply_flags_puts_a_change_in_force_without_a_step(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=11)), device_loop=True))
    engine.set_flag("ARC_GRAPH_DEVICE_LOOP", False)
    assert engine.flags()["ARC_GRAPH_DEVICE_LOOP"] is True, "asked for, not in force before the boundary"
    engine.apply_flags()
    assert engine.flags()["ARC_GRAPH_DEVICE_LOOP"] is False
