"""Scheduler behaviour beyond exact tokens: the bucket scheduler's waitlist and urgency, the paged
scheduler's limits and choice of victim."""

from __future__ import annotations

from engine import Engine, EngineConfig, SamplingParams
from engine.sequence import RunningCompletion, Swapped, Waiting

GREEDY = dict(temperature=0, ignore_eos=True)


def test_default_scheduler_waitlists_without_a_state_change_and_starves_nobody(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=3)), scheduler="bucket", block_size=4))
    stand_downs = []
    engine.stand_down_listeners.append(stand_downs.append)
    # Five prompts of five lengths: five buckets that never merge, as each grows by one per step it runs.
    for i, length in enumerate((3, 9, 15, 21, 27)):
        engine.add_request(f"r{i}", list(range(50, 50 + length)), SamplingParams(max_tokens=12, **GREEDY))
    last_ran = {f"r{i}": 0 for i in range(5)}
    longest_wait, saw_waitlisted_running = 0, False
    for step in range(1, 200):
        if not engine.has_unfinished_requests():
            break
        outputs = engine.step()
        ran = {o.request_id for o in outputs}
        assert len(ran) == 1 or step == 1, "one bucket per step"
        for seq in engine.scheduler.running:
            if seq.request_id not in ran:
                # Moved aside with no state change: still running as far as any funnel can tell.
                saw_waitlisted_running |= isinstance(seq.state, RunningCompletion)
        for rid in last_ran:
            if rid in ran:
                longest_wait = max(longest_wait, step - last_ran[rid])
                last_ran[rid] = step
    assert not engine.has_unfinished_requests()
    assert saw_waitlisted_running, "liveness: the waitlist really held running sequences"
    assert longest_wait <= 5, f"a sequence waited {longest_wait} steps with only 5 buckets"
    assert len(stand_downs) == 5  # one per finish; waitlisting never stood anyone down
    assert engine.kv_cache.pool.num_free == engine.kv_cache.num_blocks


def test_paged_scheduler_respects_max_num_seqs(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=3)), max_num_seqs=3))
    for i in range(7):
        engine.add_request(f"r{i}", "hello there", SamplingParams(max_tokens=5, **GREEDY))
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, len(engine.scheduler.running))
    assert peak == 3


def test_paged_preemption_takes_the_youngest_and_swap_brings_it_back(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=3)), block_size=4, num_kv_blocks=10,
                                 swap_blocks=16))
    events = []
    engine.stand_down_listeners.append(lambda seq: events.append((seq.request_id, seq.state)))
    engine.add_request("old", list(range(50, 62)), SamplingParams(max_tokens=20, **GREEDY))
    engine.step()
    engine.add_request("young", list(range(70, 82)), SamplingParams(max_tokens=20, **GREEDY))
    while engine.has_unfinished_requests():
        engine.step()
    preempted = [rid for rid, state in events if isinstance(state, (Swapped, Waiting))]
    assert preempted and set(preempted) == {"young"}
    assert ("young", Swapped()) in events
    assert engine.scheduler.swap_space.allocator.num_free == 16
    assert engine.kv_cache.pool.num_free == 10
