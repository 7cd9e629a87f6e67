"""Chunked prefill: a prompt longer than the step's token budget is fed over several steps.

What must hold (the batch-invariance oracle's chunked case, test_batch_invariance.py, checks the
answers themselves): the other streams' decodes go on during the long prefill, one token per step; a
sequence mid-prefill never samples, is never served a parked token nor a burst; it works after a
cached prefix; an abort mid-prefill leaves the pool whole; a preemption mid-prefill resumes it.
"""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.sequence import RunningPrompt
from engine.step_data import TokenSource

LONG = [(7 * i) % 3000 + 5 for i in range(150)]  # 150 tokens: 19 chunks of 8
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def make(checkpoint, **overrides) -> Engine:
    config = dict(model=str(checkpoint), block_size=4, num_kv_blocks=200, device_loop=True, burst_length=4,
                  max_num_batched_tokens=8)
    return Engine(EngineConfig(**{**config, **overrides}))


def test_decodes_progress_every_step_of_a_long_prefill(tiny_checkpoint):
    engine = make(tiny_checkpoint("llama", seed=5))
    for name in ("a", "b"):
        engine.add_request(name, [11, 12, 13], GREEDY)
    engine.step()  # both prefilled: they decode from here on
    engine.add_request("long", LONG, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    [long_seq] = [seq for seq in engine.live_sequences() if seq.request_id == "long"]
    chunk_steps, bursts_before = 0, engine.device_loop.bursts
    while True:
        outputs = {o.request_id: o for o in engine.step()}
        assert {"a", "b"} <= outputs.keys() and all(len(outputs[r].token_ids) == 1 for r in ("a", "b")), \
            f"step {chunk_steps + 1} of the long prefill: the decodes did not each get a token: {outputs}"
        if "long" in outputs:  # it sampled its first token: only its last chunk may have
            assert 6 * (chunk_steps + 1) == len(LONG), \
                f"a token was sampled after {6 * (chunk_steps + 1)} of the prompt's {len(LONG)} tokens were fed"
            break
        chunk_steps += 1
        [source] = [row.source for row in engine.last_step.rows if row.seq_id == long_seq.seq_id]
        assert source is TokenSource.CHUNK and isinstance(long_seq.state, RunningPrompt)
        assert long_seq.num_cached == 6 * chunk_steps, "each chunk is the budget (8) less the two decodes"
    assert chunk_steps == 24, "liveness: the long prompt was fed over many steps (150 = 25 chunks of 6)"
    assert engine.device_loop.bursts == bursts_before, "no burst while a row is mid-prefill"
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.device_loop.bursts > bursts_before, "liveness: the decodes burst once the prefill is done"


def test_a_prompt_takes_the_whole_step_budget_unless_a_stream_decodes(tiny_checkpoint):
    """max_prefill_beside_decodes bounds a step's prompt tokens only while someone decodes: alone, a
    long prompt goes in chunks of the step's budget; beside decodes, in chunks of the smaller bound."""
    engine = make(tiny_checkpoint("llama", seed=9), device_loop=False, max_num_batched_tokens=64,
                  max_prefill_beside_decodes=5)
    engine.add_request("alone", LONG, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    [alone] = engine.live_sequences()
    engine.step()
    assert alone.num_cached == 64, "no stream decodes: the prompt takes the step's whole budget"
    engine.step()
    engine.step()  # 150 = 64 + 64 + 22: it samples its first token and decodes from here on
    engine.add_request("beside", [token + 1 for token in LONG], GREEDY)  # nothing of it cached
    [beside] = [seq for seq in engine.live_sequences() if seq.request_id == "beside"]
    fed = []
    for _ in range(3):
        engine.step()
        fed.append(beside.num_cached)
    assert fed == [5, 10, 15], "beside a decode, a step feeds at most max_prefill_beside_decodes prompt tokens"


def test_chunked_answer_equals_unchunked_after_a_cached_prefix(tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama", seed=6)
    whole = make(checkpoint, max_num_batched_tokens=4096, device_loop=False)
    [expected] = whole.generate([LONG], GREEDY)
    engine = make(checkpoint, device_loop=False)
    engine.generate([LONG[:100]], SamplingParams(max_tokens=1, temperature=0))  # caches 25 blocks of 4
    steps = 0
    engine.add_request("long", LONG, GREEDY)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens += output.token_ids
            assert output.usage is None or output.usage.cached_tokens == 100
        steps += 1
    assert steps == 7 + 39, "50 uncached tokens in chunks of 8 (7 steps, the last one samples), then 39 decodes"
    assert tokens == expected.token_ids, "the chunked answer after a cached prefix differs from the unchunked one"


def test_abort_mid_prefill_leaves_the_pool_whole(tiny_checkpoint):
    engine = make(tiny_checkpoint("llama", seed=7), device_loop=False)
    engine.add_request("long", LONG, GREEDY)
    for _ in range(3):
        assert engine.step() == []
    [seq] = engine.live_sequences()
    assert isinstance(seq.state, RunningPrompt) and seq.num_cached == 24, "liveness: aborted mid-prefill"
    assert engine.kv_cache.pool.num_held == len(seq.block_table) == 38
    engine.abort("long")
    [final] = engine.step()
    assert final.finished and final.finish_reason == "canceled" and final.token_ids == []
    pool = engine.kv_cache.pool
    assert pool.num_held == 0 and pool.num_free == engine.kv_cache.num_blocks, "a leaked block reference"
    assert pool.num_cached == 6, "the full blocks of the chunks fed stay cached"


@pytest.mark.parametrize("swap_blocks", [0, 64], ids=["recompute", "swap"])
def test_preempted_mid_prefill_resumes_with_the_same_answer(tiny_checkpoint, swap_blocks):
    checkpoint = tiny_checkpoint("llama", seed=8)
    [expected] = make(checkpoint, device_loop=False, max_num_batched_tokens=4096).generate([LONG], GREEDY)
    # 48 blocks: the long one needs 38 for its prompt (48 to finish), the short one 9 at first (24 to
    # finish), so the short one growing a few steps into the long prefill pushes it out.
    engine = make(checkpoint, device_loop=False, num_kv_blocks=48, swap_blocks=swap_blocks)
    stood_down: list[str] = []
    engine.stand_down_listeners.append(lambda seq: stood_down.append(f"{seq.request_id}:{type(seq.state).__name__}"))
    engine.add_request("short", list(range(20, 56)), SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    engine.step()
    engine.add_request("long", LONG, GREEDY)
    tokens: dict[str, list[int]] = {"short": [], "long": []}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[output.request_id] += output.token_ids
        for seq in engine.scheduler.running:  # back from a swap or a recompute, it still prefills
            assert isinstance(seq.state, RunningPrompt) == (seq.num_uncached > 1), seq
    assert any(s.startswith("long:") and not s.endswith("Done") for s in stood_down), \
        f"liveness: the long prefill was preempted: {stood_down}"
    assert tokens["long"] == expected.token_ids
    pool = engine.kv_cache.pool
    assert pool.num_held == 0 and pool.num_free == engine.kv_cache.num_blocks
