"""The leak tests of the design notes, through the real engine step, runner and sampler.

Each test sets up the shape that leaked in the notes (a tail parked by a sequence that stopped
mid-burst, a waitlist interleave with no state change, batch growth, a preempted sequence prefilled
again, logits served for the wrong sequence, parked tokens in front of a prefill) and checks that
every request still gets exactly its solo tokens. Each carries a liveness control, so its assertions
cannot pass because the loop never ran. tests/mutation removes each mechanism in turn and requires
these tests to fail.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.decode.device_loop import KILL_SWITCH, KillSwitch
from engine.decode.runner import TaggedLogits
from engine.model import attention
from engine.sequence import Done, Error, FinishedAborted, StopReason, Waiting
from tests.gguf_files import copy_gguf
from tests.reference import solo
from tests.served_route import serve_as_make_run

BURST = 4
GREEDY = dict(temperature=0, ignore_eos=True)
PROMPT_A, PROMPT_B = "class Node:", "import os"  # both start with distinct tokens on this checkpoint


@pytest.fixture(params=["hf", "gguf-Q4_1", "served-Q4_1"])
def checkpoint(request, checkpoint, tiny_gguf, monkeypatch):
    """The model of every engine in a test: the HF checkpoint (tests/engine/conftest.py's), or a random
    GGUF file served with quantized weights (Q4_1 linears and a Q8_0 embedding, as SmolLM2's file): in
    float32 on torch's exact route, or ("served") as `make run` serves it, bfloat16 on the fused layer.
    Seed 13 for the GGUF: with 11, A's fourth token is a partial UTF-8 character, which the stop-string
    path cannot use."""
    if request.param == "hf":
        return checkpoint
    if request.param.startswith("served"):
        serve_as_make_run(monkeypatch)
    else:
        monkeypatch.setattr(EngineConfig, "weight_format", property(lambda self: "quantized"))
    path, _ = tiny_gguf("llama", request.param.split("-")[1], seed=13, embedding_qtype="Q8_0")
    return path


def loop_engine(checkpoint, kill_switch: KillSwitch = KILL_SWITCH, **config) -> Engine:
    return Engine(EngineConfig(model=str(checkpoint), block_size=4, device_loop=True, burst_length=BURST, **config),
                  kill_switch=kill_switch)


def run_to_end(engine: Engine, outputs: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    outputs = outputs if outputs is not None else {}
    for _ in range(300):
        if not engine.has_unfinished_requests():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    raise AssertionError("engine did not finish")


def start_burst(engine: Engine, params: SamplingParams) -> dict[str, list[int]]:
    """A prefills, bursts (parks BURST - 1 tokens, drains the first) and drains one parked token."""
    engine.add_request("A", PROMPT_A, params)
    outputs: dict[str, list[int]] = {}
    for _ in range(2):
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    loop = engine.device_loop
    assert loop.bursts == 1 and loop.parked.pending() == BURST - 2 + 1  # liveness: a real burst parked
    taken_before = loop.parked.taken
    for out in engine.step():
        outputs.setdefault(out.request_id, []).extend(out.token_ids)
    assert loop.parked.taken == taken_before + 1, "liveness: the owner drained one parked token"
    return outputs


# -- a sequence that stops mid-burst leaves nothing parked --------------------------------------

def eos_at(checkpoint, token):
    if checkpoint.suffix == ".gguf":  # a GGUF file names its EOS in its metadata
        copy_gguf(checkpoint, checkpoint.with_suffix(".new"), set_values={"tokenizer.ggml.eos_token_id": token})
        checkpoint.with_suffix(".new").replace(checkpoint)
    else:
        (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [token]}))


MID_BURST_PATHS = ["eos", "stop_token", "stop_string", "tool_calls", "cancel", "operator_abort", "terminate_all",
                   "forward_error"]


@pytest.mark.parametrize("path", MID_BURST_PATHS)
def test_a_sequence_stopping_mid_burst_leaves_no_parked_tail(checkpoint, path, monkeypatch):
    free = solo(checkpoint, PROMPT_A, SamplingParams(max_tokens=12, **GREEDY), device_loop=False)
    engine_config, params = {}, dict(max_tokens=12, **GREEDY)
    # Paths that end on A's fourth token: prefill gives token 0, the burst tokens 1-4, token 3 is the
    # second parked token, so one parked token (4) is still queued when A stops.
    tokenizer = Engine(EngineConfig(model=str(checkpoint))).tokenizer
    fourth_text = tokenizer.decode(free[3:4])
    if path == "eos":
        eos_at(checkpoint, free[3])
        params["ignore_eos"] = False
        assert free[3] not in free[:3]
    elif path == "stop_token":
        params["stop_token_ids"] = [free[3]]
        assert free[3] not in free[:3]
    elif path in ("stop_string", "tool_calls"):
        assert fourth_text and fourth_text not in tokenizer.decode(free[:3]) and "\ufffd" not in fourth_text
        params["stop" if path == "stop_string" else "tool_call_end"] = [fourth_text] if path == "stop_string" \
            else fourth_text
    engine = loop_engine(checkpoint, **engine_config)
    stood_down = []
    engine.stand_down_listeners.append(lambda seq: stood_down.append((seq.request_id, seq.state)))
    outputs = start_burst(engine, SamplingParams(**params))  # A has drained tokens 0-2

    if path == "cancel":
        engine.abort("A")
    elif path == "operator_abort":
        engine.abort("A", by_operator=True)
    elif path == "terminate_all":
        engine.terminate_all()
    elif path == "forward_error":
        engine.add_request("B", PROMPT_B, SamplingParams(max_tokens=3, **GREEDY))
        monkeypatch.setattr(engine.loaded.model, "forward", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    assert engine.device_loop.parked.pending() >= 1  # liveness: a tail is parked when A stops
    assert 0 in engine.device_loop.eligible  # A (seq 0) is published as eligible while it bursts
    run_to_end(engine, outputs)
    monkeypatch.undo()

    expected_state = {"eos": Done(StopReason.EOS), "stop_token": Done(StopReason.STOP_TOKEN),
                      "stop_string": Done(StopReason.STOP_STRING), "tool_calls": Done(StopReason.TOOL_CALLS),
                      "cancel": Done(StopReason.CANCELED), "operator_abort": FinishedAborted(),
                      "terminate_all": Done(StopReason.CANCELED)}.get(path)
    state_of_a = [state for rid, state in stood_down if rid == "A"][0]
    assert state_of_a == expected_state if expected_state else isinstance(state_of_a, Error)
    assert engine.device_loop.parked.pending() == 0, "A's undrained tail outlived it"
    assert 0 not in engine.device_loop.eligible, "the stand-down clears A's eligibility"
    # The next sequence decodes on its own logits, through bursts of its own.
    after = run_to_end_single(engine, "C", PROMPT_B)
    assert after == solo(checkpoint, PROMPT_B, SamplingParams(max_tokens=10, **GREEDY), device_loop=False)


def run_to_end_single(engine: Engine, request_id: str, prompt: str) -> list[int]:
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=10, **GREEDY))
    return run_to_end(engine)[request_id]


# -- the waitlist interleave: no state change, only the owner tag stands between A and B -------

def test_a_waitlisted_sequence_with_no_state_change_cannot_leak_into_the_next(checkpoint, caplog):
    greedy = SamplingParams(max_tokens=14, **GREEDY)
    sampled = SamplingParams(max_tokens=14, temperature=0.8, seed=3, ignore_eos=True)  # never bursts
    engine = loop_engine(checkpoint, scheduler="bucket")
    engine.add_request("A", list(range(100, 105)), greedy)   # different lengths: different buckets,
    engine.add_request("B", list(range(200, 212)), sampled)  # so the waitlist moves them aside in turn
    with caplog.at_level(logging.WARNING, logger="engine.decode.device_loop"):
        outputs = run_to_end(engine)
    loop = engine.device_loop
    assert loop.bursts >= 2 and loop.parked.foreign_dropped > 0, "liveness: the interleave really happened"
    assert any("foreign parked tokens" in r.getMessage() for r in caplog.records)
    events = engine.leak_events.recent()
    assert events and sum(e.dropped for e in events) == loop.parked.foreign_dropped, "each drop is on the record"
    assert outputs["A"] == solo(checkpoint, list(range(100, 105)), greedy, device_loop=False)
    assert outputs["B"] == solo(checkpoint, list(range(200, 212)), sampled, device_loop=False)


def test_batch_growth_from_one_to_two_keeps_each_sequence_its_own(checkpoint):
    params = SamplingParams(max_tokens=16, **GREEDY)
    engine = loop_engine(checkpoint)
    outputs = start_burst(engine, params)
    engine.add_request("B", PROMPT_B, params)  # joins while A has parked tokens
    assert engine.device_loop.parked.pending() >= 1
    run_to_end(engine, outputs)
    assert outputs["A"] == solo(checkpoint, PROMPT_A, params, device_loop=False)
    assert outputs["B"] == solo(checkpoint, PROMPT_B, params, device_loop=False)


# -- a preempted sequence is prefilled again and must not continue from stale device buffers ----

def test_a_preempted_sequence_re_prefilled_decodes_its_own_tokens(checkpoint):
    old, young = SamplingParams(max_tokens=40, **GREEDY), SamplingParams(max_tokens=30, **GREEDY)
    engine = loop_engine(checkpoint, num_kv_blocks=14)
    dropped_at_preemption = []
    original = engine.device_loop.stand_down

    def spy(seq):
        pending = engine.device_loop.parked.pending(seq.seq_id)
        if isinstance(seq.state, Waiting):
            dropped_at_preemption.append(pending)
        original(seq)

    engine.device_loop.stand_down = spy
    engine.add_request("old", list(range(300, 310)), old)
    outputs: dict[str, list[int]] = {}
    for _ in range(3):  # staggered so that the pool runs dry while A has a token parked
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    engine.add_request("A", list(range(100, 110)), young)
    run_to_end(engine, outputs)
    assert any(n > 0 for n in dropped_at_preemption), "liveness: A was preempted with tokens parked"
    assert outputs["A"] == solo(checkpoint, list(range(100, 110)), young, device_loop=False)
    assert outputs["old"] == solo(checkpoint, list(range(300, 310)), old, device_loop=False)


# -- logits served for the wrong sequence fail the step instead of sampling ----------------------

def test_an_aliased_step_fails_instead_of_sampling_another_sequences_logits(checkpoint, monkeypatch):
    engine = Engine(EngineConfig(model=str(checkpoint), device_loop=False))
    recorded: list[TaggedLogits] = []
    real_forward = engine.runner.forward

    def recording(seqs, *chunking):  # the runner also passes each row's feeds and which rows sample
        logits = real_forward(seqs, *chunking)
        recorded.append(logits)
        return logits

    monkeypatch.setattr(engine.runner, "forward", recording)
    engine.add_request("A", PROMPT_A, SamplingParams(max_tokens=2, **GREEDY))
    run_to_end(engine)
    stale = recorded[-1]
    # Liveness: the very same logits, tagged for their own sequence, sample without complaint.
    assert stale.seq_ids == (0,)
    monkeypatch.setattr(engine.runner, "forward", lambda seqs, *chunking: stale)  # served to B: an aliased step
    engine.add_request("B", PROMPT_B, SamplingParams(max_tokens=2, **GREEDY))
    [out] = engine.step()
    assert out.finished and out.finish_reason == "error" and "logits computed for sequences [0]" in out.error
    assert out.token_ids == []
    [event] = engine.leak_events.recent()  # for the operator's dashboard
    assert event.kind == "aliased_logits" and "were about to be sampled for [1]" in event.message


# -- the prefill guard: parked tokens never replace a prefill ----------------------------------

def test_parked_tokens_never_replace_a_prefill(checkpoint):
    expected = solo(checkpoint, PROMPT_B, SamplingParams(max_tokens=3, **GREEDY), device_loop=False)
    engine = loop_engine(checkpoint)
    engine.add_request("B", PROMPT_B, SamplingParams(max_tokens=3, **GREEDY))
    # A stale queue for B in front of its prefill: what the funnel prevents, staged directly.
    engine.device_loop.parked.park(0, owner=0, tokens=[21, 22])
    [first] = engine.step()
    assert first.token_ids == expected[:1]
    # Liveness: at a one-token decode step, B's own parked token is taken.
    engine.device_loop.parked.park(0, owner=0, tokens=[23])
    [second] = engine.step()
    assert second.token_ids == [23]


# -- the kill switch -----------------------------------------------------------------------------

def test_a_fault_in_a_burst_kills_the_loop_and_host_decode_carries_on(checkpoint, kill_switch, monkeypatch):
    params = SamplingParams(max_tokens=12, **GREEDY)
    engine = loop_engine(checkpoint, kill_switch)
    real_logits = engine.loaded.model.logits
    calls = {"n": 0}

    def poisoned(hidden):
        calls["n"] += 1
        out = real_logits(hidden)
        return out.fill_(float("nan")) if calls["n"] == 2 else out  # call 1: prefill; 2: inside the burst

    monkeypatch.setattr(engine.loaded.model, "logits", poisoned)
    engine.add_request("A", PROMPT_A, params)
    outputs = run_to_end(engine)
    assert kill_switch.killed and "non-finite" in kill_switch.reason
    assert outputs["A"] == solo(checkpoint, PROMPT_A, params, device_loop=False)
    assert engine.device_loop.bursts == 1  # the faulted one; host decode did the rest
    engine.set_flag("ARC_DEVICE_LOOP_KILLED", False)  # the operator re-arms
    monkeypatch.undo()
    engine.add_request("B", PROMPT_B, params)
    outputs = run_to_end(engine)
    assert not kill_switch.killed and engine.device_loop.bursts > 1
    assert outputs["B"] == solo(checkpoint, PROMPT_B, params, device_loop=False)


def test_turning_the_loop_off_mid_drain_and_on_again_stays_exact(checkpoint):
    params = SamplingParams(max_tokens=14, **GREEDY)
    engine = loop_engine(checkpoint)
    outputs = start_burst(engine, params)
    engine.set_flag("ARC_GRAPH_DEVICE_LOOP", False)
    for _ in range(3):
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    assert engine.device_loop.parked.pending() == 0
    engine.set_flag("ARC_GRAPH_DEVICE_LOOP", True)
    run_to_end(engine, outputs)
    assert engine.device_loop.bursts >= 2
    assert outputs["A"] == solo(checkpoint, PROMPT_A, params, device_loop=False)


# -- shapes a review found: a sequence's own stale slot, kill/re-arm mid-sequence, NaN in KV ------

def test_a_sequence_served_at_another_row_never_drains_its_old_slot(checkpoint):
    """Default scheduler, staggered arrivals: r2 parks at row 0, is then served at row 1 (a prefill took
    row 0), and later returns to row 0. Its old slot must be gone by then."""
    import random

    rng = random.Random(0)
    shapes = [(4, 1, 1), (8, 1, 0), (2, 7, 1), (7, 5, 6), (2, 16, 0)]  # (prompt length, max_tokens, arrival step)
    prompts = [[rng.randrange(50, 4000) for _ in range(length)] for length, _, _ in shapes]
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, device_loop=True, burst_length=3,
                                 scheduler="bucket", kv_cache_mb=4))
    outputs: dict[str, list[int]] = {}
    for step in range(200):
        for i, ((_, max_tokens, arrival), prompt) in enumerate(zip(shapes, prompts)):
            if arrival == step:
                engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, **GREEDY))
        if step > 6 and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    assert engine.device_loop.bursts >= 3, "liveness: bursts ran"
    for i, ((_, max_tokens, _), prompt) in enumerate(zip(shapes, prompts)):
        expected = solo(checkpoint, prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), device_loop=False)
        assert outputs[f"r{i}"] == expected, f"r{i}"


def test_killing_and_re_arming_mid_sequence_stays_exact(checkpoint, kill_switch):
    params = SamplingParams(max_tokens=16, **GREEDY)
    engine = loop_engine(checkpoint, kill_switch)
    outputs = start_burst(engine, params)  # tokens parked
    engine.set_flag("ARC_DEVICE_LOOP_KILLED", True)
    for _ in range(2):  # host decode moves A on while its old tokens sit parked
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.token_ids)
    engine.set_flag("ARC_DEVICE_LOOP_KILLED", False)
    run_to_end(engine, outputs)
    assert engine.device_loop.bursts >= 2
    assert outputs["A"] == solo(checkpoint, PROMPT_A, params, device_loop=False)


def test_a_faulted_burst_leaves_no_nan_in_the_kv_cache(checkpoint, kill_switch, monkeypatch):
    """On the torch attention path, which reads a block's slots past a row's position (masked, and a
    NaN key defeats a mask). The native CPU op reads only each row's own keys, so a stale NaN there
    goes unread and this mutant-checked scrub would go untested on it."""
    monkeypatch.setattr(attention, "native_attention", lambda device: False)
    params = SamplingParams(max_tokens=10, **GREEDY)
    engine = loop_engine(checkpoint, kill_switch, num_kv_blocks=8)
    layer = engine.loaded.model.model.layers[1]
    real_forward, calls = layer.forward, {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        out = real_forward(*args, **kwargs)
        return out * float("nan") if calls["n"] == 3 else out  # call 1: prefill; 2, 3: burst steps

    with pytest.MonkeyPatch.context() as poisoning:
        poisoning.setattr(layer, "forward", poisoned)
        engine.add_request("A", PROMPT_A, params)
        outputs = run_to_end(engine)
    assert kill_switch.killed, "liveness: the burst faulted"
    assert outputs["A"] == solo(checkpoint, PROMPT_A, params, device_loop=False)
    assert not torch.isnan(engine.kv_cache.keys).any() and not torch.isnan(engine.kv_cache.values).any()
    engine.add_request("B", [1577], params)  # reuses A's blocks
    assert run_to_end(engine)["B"] == solo(checkpoint, [1577], params, device_loop=False)
