"""Bad requests get a clear error and change nothing; streaming deltas are contiguous and complete."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, InvalidSamplingParams, PromptError, RequestError, SamplingParams


@pytest.fixture
def engine(tiny_checkpoint):
    return Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=5)), block_size=4))


def snapshot(engine: Engine):
    return (engine.has_unfinished_requests(), engine.kv_cache.pool.num_free, len(engine.scheduler.waiting),
            len(engine.scheduler.running))


@pytest.mark.parametrize("prompt, params, error, fragment", [
    ("", {}, PromptError, "prompt is empty"),
    (list(range(1, 300)), {}, PromptError, "leaving no room"),
    ("hi", {"max_tokens": 0}, InvalidSamplingParams, "max_tokens"),
    ("hi", {"max_tokens": -5}, InvalidSamplingParams, "max_tokens"),
    ("hi", {"temperature": -1}, InvalidSamplingParams, "temperature"),
    ("hi", {"top_p": 0}, InvalidSamplingParams, "top_p"),
    ("hi", {"top_p": 1.01}, InvalidSamplingParams, "top_p"),
    ("hi", {"stop": [f"s{i}" for i in range(17)]}, InvalidSamplingParams, "stop"),
    ("hi", {"best_of": 2}, InvalidSamplingParams, "best_of"),
])
def test_bad_request_is_refused_and_changes_nothing(engine, prompt, params, error, fragment):
    engine.add_request("busy", "a running neighbour", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    engine.step()
    before = snapshot(engine)
    with pytest.raises(error, match=fragment):
        engine.add_request("bad", prompt, SamplingParams.from_dict({"max_tokens": 4, **params}))
    assert snapshot(engine) == before
    assert not engine.abort("bad")  # the engine never held it
    engine.step()  # the neighbour keeps running
    assert engine.has_unfinished_requests()


def test_duplicate_request_id_is_refused_while_the_first_runs(engine):
    engine.add_request("same", "first", SamplingParams(max_tokens=3, temperature=0))
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request("same", "second", SamplingParams(max_tokens=3, temperature=0))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert {o.request_id for o in outputs} == {"same"} and outputs[-1].finished


def test_generate_refuses_a_busy_engine_and_checks_every_prompt_first(engine):
    with pytest.raises(PromptError):
        engine.generate(["fine", ""], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()
    engine.add_request("streaming", "x", SamplingParams(max_tokens=2, seed=0))
    with pytest.raises(RequestError, match="idle engine"):
        engine.generate(["y"], SamplingParams(max_tokens=2))


def test_streamed_deltas_are_contiguous_and_add_up_to_the_result(engine):
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)
    [whole] = Engine(EngineConfig(model=engine.config.model)).generate(["stream me"], params)
    engine.add_request("s", "stream me", params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    offsets = [d.index for d in deltas]
    sizes = [len(d.token_ids) for d in deltas]
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert "".join(d.text for d in deltas) == whole.text
    assert [lp.token_id for d in deltas for lp in d.logprobs] == whole.token_ids
    last = deltas[-1]
    assert last.usage.completion_tokens == 20 and all(d.usage is None for d in deltas[:-1])
    timings = last.timings
    assert 0 <= timings["queue_time"] <= timings["time_to_first_token"] <= timings["total_time"]
    assert timings["decode_tokens_per_s"] > 0
