"""The step's data as it flows (engine/step_data.py): the scheduler's batch holds every KV block grant of
the step, a burst's lookahead included, granted for every row or none; the runner carries the device
loop's plan out without growing a block table and says where each row's token came from; the engine
keeps that output for inspection and clears it when nothing ran."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.scheduler.kv_cache import blocks_needed
from engine.step_data import NOTHING_RAN, BurstGrant, ScheduledBatch, TokenSource

GREEDY = dict(temperature=0, ignore_eos=True)
PARKED, BURST, HOST = TokenSource.PARKED, TokenSource.BURST, TokenSource.HOST


@pytest.mark.parametrize("pool, granted", [(5, False), (6, True)], ids=["short", "room"])
def test_a_burst_lookahead_is_granted_for_every_row_or_for_none(checkpoint, pool, granted):
    """The paged scheduler grows blocks on demand (the default one reserves whole sequences at admission,
    so a lookahead never misses a block there)."""
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, num_kv_blocks=pool, device_loop=False))
    wanted = BurstGrant(rows=(0, 1), steps=6)  # each row: 4 + 6 - 1 = 9 tokens, 3 blocks, 2 more than its prompt's
    engine.scheduler.lookahead = lambda seqs: wanted
    for request_id in ("a", "b"):
        engine.add_request(request_id, [5, 6, 7, 8], SamplingParams(max_tokens=6, **GREEDY))
    batch = engine.scheduler.schedule()
    tables = [len(seq.block_table) for seq in batch.sequences]
    if granted:
        assert batch.burst == wanted and tables == [3, 3] and engine.kv_cache.pool.num_free == 0
    else:  # room for the first row's lookahead only: nothing is granted, nothing is held back
        assert batch.burst is None and tables == [1, 1] and engine.kv_cache.pool.num_free == pool - 2
    assert engine.scheduler.num_preemptions == 0


def test_the_runner_says_where_each_token_came_from_and_grows_no_block_table(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, device_loop=True, burst_length=4))
    real_run, batches = engine.runner.run, []

    def recording(batch: ScheduledBatch, requests):
        before = [(seq.num_tokens, list(seq.block_table)) for seq in batch.sequences]
        output = real_run(batch, requests)
        batches.append((batch, before, [list(seq.block_table) for seq in batch.sequences]))
        return output

    engine.runner.run = recording
    engine.add_request("A", "class Node:", SamplingParams(max_tokens=8, **GREEDY))
    sources = []
    while engine.has_unfinished_requests():
        engine.step()
        [row] = engine.last_step.rows
        sources.append(row.source)
        assert engine.last_step.rows_by_seq_id() == {0: 0}
    # Prefill on the host; a burst of 4 (1 returned, 3 parked); then a burst of the 3 tokens left.
    assert sources == [HOST, BURST, PARKED, PARKED, PARKED, BURST, PARKED, PARKED]
    bursts = [(batch, before, after) for batch, before, after in batches if batch.burst is not None]
    assert [batch.burst.steps for batch, _, _ in bursts] == [4, 3]
    for batch, [(tokens, table)], [table_after] in bursts:
        assert table_after == table, "the runner grew a block table"
        # The grant covers every position the burst writes: len-1 .. len+steps-2 at the step it ran.
        assert len(table) >= blocks_needed(tokens + batch.burst.steps - 1, 4)
    assert engine.step() == [] and engine.last_step is NOTHING_RAN, "nothing ran: no sequence sits at a row"


def test_host_rows_carry_their_logprob_records(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), device_loop=True, burst_length=4))
    engine.add_request("A", "class Node:", SamplingParams(max_tokens=3, logprobs=2, **GREEDY))  # never bursts
    engine.add_request("B", "import os", SamplingParams(max_tokens=3, **GREEDY))
    engine.step()
    engine.step()
    rows = engine.last_step.rows
    assert [row.source for row in rows] == [HOST, HOST], "one ineligible row keeps the batch on the host"
    assert rows[0].logprob is not None and len(rows[0].logprob.top) == 2 and rows[1].logprob is None
