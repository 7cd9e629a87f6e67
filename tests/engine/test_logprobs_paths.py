"""Logprobs and the ending masks, whatever path produced the tokens beside them: a request that asks
for logprobs stays on the host (engine/decode/device_loop.py, can_burst), and its values must be the same
with the device loop on, while other sequences in its batch burst and drain parked tokens, as off.
min_tokens masks EOS and the stop tokens in the sampler until that many tokens are out."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.step_data import TokenSource

GREEDY = dict(temperature=0, ignore_eos=True)


def run_mixed(checkpoint, device_loop: bool):
    """B (greedy, eligible) runs alone long enough to burst and park; A and C (logprobs, sampled and
    greedy) join it mid-way, and C runs on beside B alone once A is done (a batch of an eligible row
    and a greedy one with logprobs). Returns A's and C's records and the sources B's tokens came from."""
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, device_loop=device_loop, burst_length=4))
    engine.add_request("B", "import os", SamplingParams(max_tokens=20, **GREEDY))
    records: dict[str, list] = {"A": [], "C": []}
    tokens: dict[str, list] = {"A": [], "C": []}
    b_sources = []
    for step in range(30):
        if step == 3:
            engine.add_request("A", "class Node:", SamplingParams(max_tokens=4, temperature=0.9, seed=4,
                                                                 logprobs=3, ignore_eos=True))
            engine.add_request("C", "def f(x):", SamplingParams(max_tokens=10, logprobs=2, **GREEDY))
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.request_id in records:
                records[output.request_id] += output.logprobs or []
                tokens[output.request_id] += output.token_ids
        rows = engine.last_step.rows_by_seq_id()
        b_sources += [engine.last_step.rows[rows[0]].source] if 0 in rows else []
    return records, tokens, b_sources


def test_a_tokens_logprob_is_the_same_whichever_path_ran_beside_it(checkpoint):
    on_records, on_tokens, on_sources = run_mixed(checkpoint, device_loop=True)
    off_records, off_tokens, off_sources = run_mixed(checkpoint, device_loop=False)
    # liveness: with the loop on, B really burst and drained parked tokens; off, it never did
    assert TokenSource.PARKED in on_sources and TokenSource.BURST in on_sources
    assert set(off_sources) == {TokenSource.HOST}
    for request_id in ("A", "C"):
        assert on_tokens[request_id] == off_tokens[request_id]
        assert len(on_tokens[request_id]) == {"A": 4, "C": 10}[request_id]
        assert [r.token_id for r in on_records[request_id]] == on_tokens[request_id]
        for on, off in zip(on_records[request_id], off_records[request_id]):
            assert on.logprob == pytest.approx(off.logprob, abs=1e-5)
            assert [t for t, _ in on.top] == [t for t, _ in off.top]
            assert [v for _, v in on.top] == pytest.approx([v for _, v in off.top], abs=1e-5)
    for record in on_records["C"]:  # greedy: the chosen token is the most likely one, with its value
        assert record.top[0][0] == record.token_id and record.top[0][1] == pytest.approx(record.logprob)


def test_min_tokens_holds_back_the_stop_tokens_and_then_lets_them_end_it(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), device_loop=True, burst_length=4))
    [plain] = engine.generate(["class Node:"], SamplingParams(max_tokens=8, **GREEDY))
    first = plain.token_ids[0]
    [stopped] = engine.generate(["class Node:"], SamplingParams(max_tokens=8, stop_token_ids=[first], **GREEDY))
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    [held] = engine.generate(["class Node:"], SamplingParams(max_tokens=12, stop_token_ids=[first], min_tokens=4,
                                                             **GREEDY))
    assert first not in held.token_ids[:4] and len(held.token_ids) >= 4
    assert held.token_ids[-1] == first or len(held.token_ids) == 12
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)
