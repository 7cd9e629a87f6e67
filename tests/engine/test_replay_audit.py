"""The replay audit (engine/host/replay_audit.py) and the records it compares (engine/reproduce.py).

The leak test is a batched-row mutant: one row's logits perturbed in their last bit only when the
batch holds more than 3 rows. Requests that ran in such a batch are re-run alone, where the mutant does
not fire, and the audit must report the difference as a leak event naming the first differing token.
Its liveness control is the same run without the mutant: every re-run equal, no event. Every sampled
request here has a seed, but the one that checks an unseeded request gets a recorded seed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.decode import runner
from engine.decode.leak_events import REPLAY_MISMATCH
from engine.host.replay_audit import AUDIT_SCOPE, AuditSettings, ReplayAudit
from engine.outputs import RequestOutput
from engine.reproduce import ModelIdentity, compare, record_of

PROMPTS = [[5, 9, 14, 3], [7, 7, 21], [30, 2, 8, 11, 4], [12, 40], [3, 3, 3, 9, 17, 25]]


@pytest.fixture(scope="module")
def engine(built_checkpoints) -> Engine:
    return Engine(EngineConfig(model=str(built_checkpoints("llama", seed=11)), block_size=4))


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=6, temperature=0.8, seed=seed, logprobs=2, ignore_eos=True)


def run_live(engine: Engine, audit: ReplayAudit) -> list[RequestOutput]:
    """PROMPTS batched together, each finished one offered to the audit; the last outputs, by request."""
    for n, prompt in enumerate(PROMPTS):
        engine.add_request(f"live-{n}", prompt, sampled(100 + n))
    finished = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished.append(output)
                audit.offer(output)
    return finished


def run_audits(engine: Engine, audit: ReplayAudit) -> list:
    """Drive the idle engine as a host does: tick, step, hand the re-runs' outputs back."""
    results = []
    audit.tick(engine)
    while engine.has_unfinished_requests():
        for output in engine.step():
            result = audit.observe(output)
            if result is not None:
                results.append(result)
        audit.tick(engine)
    return results


def audit_of(engine: Engine, permille: int = 1000) -> ReplayAudit:
    return ReplayAudit(AuditSettings(permille), engine.leak_events)


def new_events(engine: Engine, since: int) -> list:
    return [e for e in engine.leak_events.since(since)[0] if e.kind == REPLAY_MISMATCH]


def test_without_the_mutant_every_batched_request_reruns_equal(engine):
    """The liveness control of the mutant test below: the same run, every re-run bit-equal."""
    cursor = engine.leak_events.last_number
    audit = audit_of(engine)
    finished = run_live(engine, audit)
    assert len(finished) == len(PROMPTS) and all(o.record is not None for o in finished)
    results = run_audits(engine, audit)
    assert [r.identical for r in results] == [True] * len(PROMPTS)
    assert audit.counts()["replay_audited"] == audit.counts()["replay_audit_equal"] == len(PROMPTS)
    assert new_events(engine, cursor) == []


def test_a_row_perturbed_only_when_batched_is_a_leak_event(engine, monkeypatch):
    if not engine.identity.invariant:
        pytest.skip(f"route {engine.identity.route} promises no bits: the audit reports distances there")
    real_sample = runner.sample

    def mutant(logits: torch.Tensor, rows):
        if logits.shape[0] > 3:  # the last bit of row 0's logits, only in a batch of more than 3
            logits = logits.clone()
            row = logits[0].float().contiguous()
            logits[0] = (row.view(torch.int32) ^ 1).view(torch.float32).to(logits.dtype)
        return real_sample(logits, rows)

    monkeypatch.setattr(runner, "sample", mutant)
    cursor = engine.leak_events.last_number
    audit = audit_of(engine)
    run_live(engine, audit)
    results = run_audits(engine, audit)
    assert audit.counts()["replay_audited"] == len(PROMPTS)
    assert audit.counts()["replay_audit_mismatched"] >= 1
    events = new_events(engine, cursor)
    assert len(events) == audit.counts()["replay_audit_mismatched"]
    differing = next(r for r in results if not r.identical)
    assert f"differs at output token {differing.index}" in events[0].message
    assert "recorded [" in events[0].message and "alone [" in events[0].message


def test_an_unseeded_request_records_a_drawn_seed_that_reproduces_it(engine):
    """The one unseeded sampled request of this module: its record carries the seed the engine drew."""
    engine.add_request("unseeded", PROMPTS[0], SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    record = outputs[-1].record
    assert isinstance(record.params["seed"], int)
    engine.add_request("again", record.prompt_ids, record.sampling_params())
    again = []
    while engine.has_unfinished_requests():
        again += engine.step()
    assert compare(record, again[-1].record).identical


def test_an_audit_yields_to_live_work_and_runs_under_its_own_scope(engine):
    audit = audit_of(engine)
    engine.add_request("first", PROMPTS[1], sampled(7))
    while engine.has_unfinished_requests():
        for output in engine.step():
            audit.offer(output)
    audit.tick(engine)
    [rerun] = engine.live_sequences()
    assert rerun.cache_scope == AUDIT_SCOPE
    engine.step()
    engine.add_request("live", PROMPTS[2], sampled(8))
    audit.tick(engine)  # live work came: the audit steps aside
    assert audit.waiting  # back in the queue, for the engine's next idle moment
    live_outputs = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if audit.owns(output.request_id):
                assert audit.observe(output) is None  # its aborted ending is no result
            else:
                live_outputs.append(output)
    assert live_outputs[-1].finished and audit.counts()["replay_audited"] == 0
    [result] = run_audits(engine, audit)
    assert result.identical and audit.counts()["replay_audited"] == 1


def test_a_difference_on_a_route_without_the_promise_is_a_distance_not_a_leak(engine):
    identity = ModelIdentity("m", "0" * 64, "cuda/dequantized/bfloat16/torch", invariant=False)
    params = dataclasses.replace(sampled(1), max_tokens=2)
    recorded = record_of(identity, [1, 2], params, [5, 6], None, "length")
    audit = audit_of(engine)
    cursor = engine.leak_events.last_number
    audit.offer(RequestOutput("r", 0, "", [5, 6], finished=True, finish_reason="length", record=recorded))
    audit._running = ("replay-audit-x", audit._queue.popleft())
    rerun = record_of(identity, [1, 2], params, [5, 7], None, "length")
    result = audit.observe(RequestOutput("replay-audit-x", 0, "", [5, 7], finished=True, record=rerun))
    assert result is not None and (result.index, result.recorded_token, result.rerun_token) == (1, 6, 7)
    assert audit.counts()["replay_audit_differed"] == 1 and audit.counts()["replay_audit_mismatched"] == 0
    assert new_events(engine, cursor) == []


def test_at_zero_permille_only_a_picked_request_is_audited(engine):
    audit = audit_of(engine, permille=0)
    audit.pick("live-2")
    run_live(engine, audit)
    results = run_audits(engine, audit)
    assert len(results) == 1 and results[0].identical


def test_the_dashboard_state_names_the_route_and_whether_it_is_invariant(engine):
    from engine.host.inspection import engine_state

    route = engine_state(engine.snapshot())["route"]
    assert route == {"route": engine.identity.route, "invariant": engine.identity.invariant,
                     "weights_sha256": engine.identity.weights_sha256}
    assert route["route"].startswith("cpu/dequantized/float32/") and len(route["weights_sha256"]) == 64
