"""Every way a sequence leaves the running set passes the set_state funnel and stands the loop down.

One test per path (docs/DEVICE_LOOP.md, "The mechanisms", the funnel stand-down): each ends with the
right finish_reason, the stand-down hook saw the sequence in the state that path sets, and the KV pool
is whole again afterwards.
"""

from __future__ import annotations

import json

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.sequence import Done, Error, FinishedAborted, FinishedIgnored, StopReason, Swapped, Waiting

PROMPT = "def parse(text):"
GREEDY = dict(temperature=0, ignore_eos=True)


class Spy:
    """Records (request_id, state) for every stand-down."""

    def __init__(self, engine: Engine) -> None:
        self.calls: list[tuple[str, object]] = []
        engine.stand_down_listeners.append(lambda seq: self.calls.append((seq.request_id, seq.state)))

    def states(self, request_id: str) -> list[object]:
        return [state for rid, state in self.calls if rid == request_id]


@pytest.fixture(autouse=True, params=[False, True], ids=["host-decode", "device-loop"])
def device_loop(request) -> bool:
    """Every path is checked with host decode and with the device loop (bursts, parked tokens): each
    test passes it to every engine it builds, the references included."""
    return request.param


def make(checkpoint, device_loop: bool, **config) -> tuple[Engine, Spy]:
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, device_loop=device_loop, **config))
    return engine, Spy(engine)


def run(engine: Engine, request_id: str, params: SamplingParams, prompt=PROMPT):
    engine.add_request(request_id, prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == request_id]
    return outputs


def free_run_tokens(checkpoint, device_loop: bool, n: int = 8) -> list[int]:
    engine = Engine(EngineConfig(model=str(checkpoint), device_loop=device_loop))
    return engine.generate([PROMPT], SamplingParams(max_tokens=n, **GREEDY))[0].token_ids


def assert_pool_whole(engine: Engine) -> None:
    assert engine.kv_cache.pool.num_free == engine.kv_cache.num_blocks


def finished(outputs):
    assert outputs[-1].finished and all(not o.finished for o in outputs[:-1])
    return outputs[-1]


def test_eos(checkpoint, device_loop):
    eos = free_run_tokens(checkpoint, device_loop)[3]
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    engine, spy = make(checkpoint, device_loop)
    last = finished(run(engine, "r", SamplingParams(max_tokens=8, temperature=0)))
    assert last.finish_reason == "stop"
    assert spy.states("r") == [Done(StopReason.EOS)]
    assert_pool_whole(engine)


def test_stop_token(checkpoint, device_loop):
    stop = free_run_tokens(checkpoint, device_loop)[2]
    engine, spy = make(checkpoint, device_loop)
    outputs = run(engine, "r", SamplingParams(max_tokens=8, stop_token_ids=[stop], **GREEDY))
    assert finished(outputs).finish_reason == "stop"
    assert [t for o in outputs for t in o.token_ids][-1] == stop
    assert spy.states("r") == [Done(StopReason.STOP_TOKEN)]
    assert_pool_whole(engine)


def test_stop_string_spanning_tokens_is_never_sent(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop)
    tokens = free_run_tokens(checkpoint, device_loop, 12)
    full = engine.tokenizer.decode(tokens)

    def spanning_stop(boundary: int) -> str | None:
        """Four characters around the end of token `boundary`'s text, if they first occur right there."""
        cut = len(engine.tokenizer.decode(tokens[:boundary]))
        stop = full[cut - 2: cut + 2]
        return stop if len(stop) == 4 and full.find(stop) == cut - 2 and "\ufffd" not in stop else None

    stop = next(s for s in map(spanning_stop, range(3, 10)) if s)
    outputs = run(engine, "r", SamplingParams(max_tokens=12, stop=[stop], **GREEDY))
    text = "".join(o.text for o in outputs)
    assert finished(outputs).finish_reason == "stop"
    assert text == full[: full.find(stop)] and stop not in text
    assert spy.states("r") == [Done(StopReason.STOP_STRING)]
    assert_pool_whole(engine)


def test_length(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop)
    outputs = run(engine, "r", SamplingParams(max_tokens=5, **GREEDY))
    assert finished(outputs).finish_reason == "length" and sum(len(o.token_ids) for o in outputs) == 5
    assert spy.states("r") == [Done(StopReason.LENGTH)]
    assert_pool_whole(engine)


def test_model_length(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop, max_model_len=24)
    prompt = list(range(100, 120))
    outputs = run(engine, "r", SamplingParams(max_tokens=50, **GREEDY), prompt)
    assert finished(outputs).finish_reason == "length" and sum(len(o.token_ids) for o in outputs) == 4
    assert spy.states("r") == [Done(StopReason.MODEL_LENGTH)]
    assert_pool_whole(engine)


def test_tool_calls(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop)
    full = engine.tokenizer.decode(free_run_tokens(checkpoint, device_loop, 10))
    marker = full[len(full) // 2: len(full) // 2 + 3]
    outputs = run(engine, "r", SamplingParams(max_tokens=10, tool_call_end=marker, **GREEDY))
    text = "".join(o.text for o in outputs)
    assert finished(outputs).finish_reason == "tool_calls"
    assert marker in text and full.startswith(text) and len(text) < len(full)
    assert spy.states("r") == [Done(StopReason.TOOL_CALLS)]
    assert_pool_whole(engine)


def test_low_confidence(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop)
    # Sampling at temperature 1 from a random model soon draws a token the model gave under 50%.
    outputs = run(engine, "r", SamplingParams(max_tokens=40, temperature=1.0, seed=3, stop_below_prob=0.5,
                                              ignore_eos=True))
    last = finished(outputs)
    assert last.finish_reason == "stop" and sum(len(o.token_ids) for o in outputs) < 40
    assert spy.states("r") == [Done(StopReason.LOW_CONFIDENCE)]
    assert_pool_whole(engine)


def test_client_cancel_takes_effect_at_the_next_step(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=50, **GREEDY))
    engine.add_request("other", PROMPT, SamplingParams(max_tokens=6, **GREEDY))
    engine.step()
    engine.step()
    assert engine.abort("r") and not engine.abort("never-added")
    outputs = engine.step()
    [last] = [o for o in outputs if o.request_id == "r"]
    assert last.finished and last.finish_reason == "canceled" and last.token_ids == []
    assert all(seq.request_id != "r" for seq in engine.scheduler.running)
    [other] = engine.scheduler.running
    assert engine.kv_cache.pool.num_free == engine.kv_cache.num_blocks - len(other.block_table)
    assert spy.states("r") == [Done(StopReason.CANCELED)]
    while engine.has_unfinished_requests():
        engine.step()
    assert spy.states("other") == [Done(StopReason.LENGTH)]  # the neighbour ran on
    assert_pool_whole(engine)


def test_operator_abort_and_terminate_all(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop)
    for rid in ("a", "b", "c"):
        engine.add_request(rid, PROMPT, SamplingParams(max_tokens=50, **GREEDY))
    engine.step()
    engine.abort("a", by_operator=True)
    engine.step()
    engine.terminate_all()
    outputs = engine.step()
    assert {o.request_id: o.finish_reason for o in outputs if o.finished} == {"b": "canceled", "c": "canceled"}
    assert spy.states("a") == [FinishedAborted()]
    assert spy.states("b") == spy.states("c") == [Done(StopReason.CANCELED)]
    assert not engine.has_unfinished_requests()
    assert_pool_whole(engine)


def test_forward_error_errors_that_step_and_the_engine_serves_on(checkpoint, device_loop, monkeypatch):
    engine, spy = make(checkpoint, device_loop)
    engine.add_request("doomed", PROMPT, SamplingParams(max_tokens=20, **GREEDY))
    engine.step()
    model = engine.loaded.model
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *args: (_ for _ in ()).throw(RuntimeError("device lost")))
    [out] = engine.step()
    assert out.finished and out.finish_reason == "error" and "device lost" in out.error
    assert isinstance(spy.states("doomed")[0], Error)
    monkeypatch.setattr(model, "forward", real_forward)
    assert finished(run(engine, "after", SamplingParams(max_tokens=4, **GREEDY))).finish_reason == "length"
    assert_pool_whole(engine)


def test_prompt_that_can_never_fit_is_ignored_with_a_reason(checkpoint, device_loop):
    engine, spy = make(checkpoint, device_loop, num_kv_blocks=4)  # 16 tokens in all
    outputs = run(engine, "big", SamplingParams(max_tokens=2, **GREEDY), list(range(100, 120)))
    last = finished(outputs)
    assert last.finish_reason == "error" and "KV blocks" in last.error and "whole pool has 4" in last.error
    assert isinstance(spy.states("big")[0], FinishedIgnored)
    assert_pool_whole(engine)


@pytest.mark.parametrize("swap_blocks, preempted_state", [(0, Waiting()), (32, Swapped())])
def test_preemption_stands_down_and_the_sequence_still_completes_exactly(checkpoint, device_loop, swap_blocks,
                                                                        preempted_state):
    solo = Engine(EngineConfig(model=str(checkpoint), device_loop=device_loop)).generate(
        [PROMPT, "class Node:"], SamplingParams(max_tokens=24, **GREEDY))
    # 12 blocks of 4 tokens cannot hold two sequences of ~30 tokens: one must be preempted.
    engine, spy = make(checkpoint, device_loop, num_kv_blocks=12, swap_blocks=swap_blocks)
    results = engine.generate([PROMPT, "class Node:"], SamplingParams(max_tokens=24, **GREEDY))
    assert engine.scheduler.num_preemptions > 0
    assert preempted_state in [state for _, state in spy.calls]
    assert [r.token_ids for r in results] == [s.token_ids for s in solo]
    assert_pool_whole(engine)
