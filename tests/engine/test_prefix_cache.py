"""Prefix caching (engine/scheduler/block_pool.py): reuse that never crosses scopes and never corrupts a holder.

The pool's own rules (reference counts, idle cached blocks reused least recently used first), then the
leak tests, each with a liveness control and a mutant in tests/mutation/mutants.py: another scope never
hits; a block is not freed while another sequence still holds it; a burst never writes into a shared
block. The oracle with the cache on vs off over shared and partial-block prefixes, aborts, preemption
and swap with the device loop and graphs on is test_prefix_cache_oracle.py.
"""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.host.inspection import engine_state
from engine.outputs import GenerationResult
from engine.scheduler.block_pool import BlockPool, OutOfBlocks, block_hash, chain_hashes
from engine.step_data import BurstGrant

GREEDY = dict(temperature=0, ignore_eos=True)
PROMPT = list(range(100, 121))  # 21 tokens: 5 full blocks of 4, the last token always fed


def engine_for(checkpoint, **config) -> Engine:
    return Engine(EngineConfig(model=str(checkpoint), block_size=4, **config))


def run(engine: Engine, request_id: str, prompt: list[int], scope: str, max_tokens: int = 4):
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), cache_scope=scope)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [output for output in engine.step() if output.request_id == request_id]
    return GenerationResult.from_deltas(deltas)


def test_the_pool_counts_references_and_reuses_idle_cached_blocks_least_recently_used_first():
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    pool.register(a, b"A" * 16)
    pool.register(b, b"B" * 16)
    pool.acquire([a])  # a second holder
    pool.free([a, b])
    assert pool.ref_count(a) == 1 and pool.ref_count(b) == 0 and pool.num_free == 3, "b idle, still cached"
    assert pool.lookup([b"A" * 16, b"B" * 16]) == [a, b]
    pool.free([a])
    assert pool.num_held == 0 and pool.num_free == 4 and pool.num_cached == 2
    # Never-cached blocks go first, then the idle cached ones, least recently used (b, freed first) first.
    fresh = pool.allocate(3)
    assert b in fresh and a not in fresh and pool.lookup([b"B" * 16]) == [] and pool.lookup([b"A" * 16]) == [a]
    with pytest.raises(OutOfBlocks):
        pool.allocate(2)
    with pytest.raises(ValueError, match="freed but not allocated"):
        pool.free([a])


def test_block_hashes_chain_over_parent_tokens_and_scope():
    tokens = list(range(12))
    alice = chain_hashes(tokens, 4, "alice", [])
    assert len(alice) == 3 and len(set(alice)) == 3
    assert chain_hashes(tokens, 4, "bob", []) != alice and chain_hashes(tokens, 4, "alice", []) == alice
    assert chain_hashes([99] + tokens[1:], 4, "alice", [])[2] != alice[2], "a block's hash depends on its parents"
    assert block_hash(None, [1, 2], "ab") != block_hash(None, [1, 2], "a"), "liveness: the scope counts"


def test_another_scope_never_hits_while_the_same_scope_does(checkpoint):
    engine = engine_for(checkpoint)
    first = run(engine, "alice-1", PROMPT, "alice")
    other = run(engine, "bob-1", PROMPT, "bob")
    again = run(engine, "alice-2", PROMPT, "alice")
    assert first.usage.cached_tokens == 0
    assert again.usage.cached_tokens == 20, "liveness: the same user's repeat finds its 5 full blocks"
    assert other.usage.cached_tokens == 0, "another user found alice's cached prefix"
    assert again.token_ids == first.token_ids == other.token_ids
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (63, 20) and stats.prefix_cache_usage > 0
    assert engine.kv_cache.pool.num_held == 0


def test_a_deployment_scope_shares_and_turning_the_flag_off_forgets(checkpoint):
    engine = engine_for(checkpoint, prefix_cache_scope="deployment")
    run(engine, "alice-1", PROMPT, "alice")
    assert run(engine, "bob-1", PROMPT, "bob").usage.cached_tokens == 20
    shown = engine_state(engine.snapshot())["prefix_cache"]  # what the dashboard's worker card shows
    assert shown["enabled"] and shown["scope"] == "deployment" and shown["hit_rate"] == 20 / 42 and shown["usage"] > 0
    engine.set_flag("ARC_PREFIX_CACHING", False)
    assert run(engine, "bob-2", PROMPT, "bob").usage.cached_tokens == 0
    assert engine.kv_cache.pool.num_cached == 0 and engine.flags()["ARC_PREFIX_CACHING"] is False


def test_a_block_another_sequence_holds_is_not_freed_when_one_holder_finishes(checkpoint):
    reference = engine_for(checkpoint, prefix_caching=False)
    expected = run(reference, "A", PROMPT, "alice", max_tokens=12).token_ids
    engine = engine_for(checkpoint, num_kv_blocks=12)
    pool = engine.kv_cache.pool
    engine.add_request("A", PROMPT, SamplingParams(max_tokens=12, **GREEDY), cache_scope="alice")
    outputs = {"A": [], "B": [], "C": []}
    engine.step()  # A's prefill: its 5 full blocks are cached now, and A holds them
    engine.add_request("B", PROMPT + [7], SamplingParams(max_tokens=1, **GREEDY), cache_scope="alice")
    for output in engine.step():  # B takes A's blocks, prefills its last two tokens and finishes
        outputs[output.request_id] += output.token_ids
    a = next(seq for seq in engine.live_sequences() if seq.request_id == "A")
    shared = a.block_table[:5]
    assert outputs["B"], "liveness: B ran and finished in that step"
    assert not any(seq.request_id == "B" for seq in engine.live_sequences())
    assert [pool.ref_count(block) for block in shared] == [1] * 5, "B's finish freed blocks A still holds"
    # Another prompt now takes every free block; with A's blocks wrongly free it would overwrite A's keys.
    engine.add_request("C", list(range(300, 324)), SamplingParams(max_tokens=2, **GREEDY), cache_scope="carol")
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id] += output.token_ids
    assert outputs["A"] == expected[1:] and len(outputs["A"]) == 11, "A's tokens after its first one"
    assert pool.num_held == 0 and pool.num_free == engine.kv_cache.num_blocks


def test_a_burst_is_never_granted_room_in_a_block_another_sequence_holds(checkpoint):
    engine = engine_for(checkpoint, device_loop=True, burst_length=4)
    pool = engine.kv_cache.pool
    for request_id in ("A", "B"):
        engine.add_request(request_id, list(range(50, 56)), SamplingParams(max_tokens=12, **GREEDY),
                           cache_scope=request_id)
    engine.step()  # both prefilled: 6 tokens each, a partial second block that the next burst writes into
    a, b = engine.live_sequences()
    engine.scheduler.lookahead = lambda seqs: BurstGrant(rows=(0, 1), steps=3)
    control = engine.scheduler.schedule()
    assert control.burst is not None, "liveness: with private blocks the burst is granted"
    # Something upstream went wrong and B's table names A's partial block: a burst would write into it.
    pool.free(b.block_table[1:])
    b.block_table = b.block_table[:1] + [a.block_table[1]]
    pool.acquire([a.block_table[1]])
    keys = engine.kv_cache.keys.clone()
    assert engine.scheduler.schedule().burst is None, "a burst was granted room in a block A holds too"
    assert pool.ref_count(a.block_table[1]) == 2 and bool((engine.kv_cache.keys == keys).all())
