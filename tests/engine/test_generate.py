"""Engine.generate on a tiny checkpoint: finish reasons, limits, seeds, bad prompts, block release."""

from __future__ import annotations

import json

import pytest

from engine import Engine, EngineConfig, PromptError, SamplingParams
from engine.sampling_params import InvalidSamplingParams

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture
def engine(tiny_checkpoint):
    return Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=11)), block_size=4))


def test_max_tokens_ends_with_length_and_usage_counts_tokens(engine):
    [result] = engine.generate(["def main():"], SamplingParams(max_tokens=9, **GREEDY))
    prompt_ids = engine.tokenizer.encode("def main():")
    assert len(result.token_ids) == 9 and result.finish_reason == "length"
    assert result.usage.as_dict() == {"prompt_tokens": len(prompt_ids), "completion_tokens": 9,
                                      "total_tokens": len(prompt_ids) + 9, "cached_tokens": 0}
    assert result.text == engine.tokenizer.decode(result.token_ids)


def test_eos_ends_with_stop(tiny_checkpoint):
    path = tiny_checkpoint("llama", seed=11)
    [free_run] = Engine(EngineConfig(model=str(path))).generate(["x = 1"], SamplingParams(max_tokens=6, **GREEDY))
    # Make the model's third greedy token its EOS: generation must stop right there.
    eos = free_run.token_ids[2]
    assert eos not in free_run.token_ids[:2], "pick a seed whose first tokens differ from the third"
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    [result] = Engine(EngineConfig(model=str(path))).generate(["x = 1"], SamplingParams(max_tokens=6, temperature=0))
    assert result.finish_reason == "stop"
    assert result.token_ids == free_run.token_ids[:3]


def test_model_length_caps_generation(tiny_checkpoint):
    engine = Engine(EngineConfig(model=str(tiny_checkpoint("llama", max_position_embeddings=32))))
    [result] = engine.generate([list(range(10, 40))], SamplingParams(max_tokens=10, **GREEDY))
    assert len(result.token_ids) == 2 and result.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_seed_dependent(engine):
    def sample(seed):
        return engine.generate(["import os"], SamplingParams(max_tokens=24, temperature=1.0, seed=seed))[0].token_ids

    assert sample(5) == sample(5)
    assert sample(5) != sample(6)


@pytest.mark.parametrize("prompt, message", [
    ("", "prompt is empty"),
    ([], "prompt is empty"),
    ([1, 5000], "outside the vocabulary"),
    ([1, -1], "outside the vocabulary"),
    ([1, True], "list of integer token ids"),
    (None, "must be a string"),
    (list(range(256)), "leaving no room"),
])
def test_bad_prompts_are_refused_and_nothing_runs(engine, prompt, message):
    with pytest.raises(PromptError, match=message):
        engine.generate(["fine", prompt], SamplingParams(max_tokens=2, temperature=0))
    assert engine.kv_cache.pool.num_free == engine.kv_cache.num_blocks


@pytest.mark.parametrize("stop_token_ids", [[4096], [7, 4_000_000_000]])
def test_stop_token_ids_past_the_vocabulary_are_refused_before_anything_runs(engine, stop_token_ids):
    """min_tokens makes the sampler mask the stop tokens, which indexes the logits with them: an id past
    the vocabulary (4096 here) would fail the forward, and on CUDA is a device-side assert. Refused at
    add_request, naming the field; the engine holds nothing of it and serves the next request."""
    params = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=stop_token_ids, seed=3)
    with pytest.raises(InvalidSamplingParams, match="not a token id of this model") as caught:
        engine.add_request("oov", "Hi", params)
    assert caught.value.parameter == "stop_token_ids"
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache.pool.num_free == engine.kv_cache.num_blocks
    [fine] = engine.generate(["Hi"], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[4095], seed=3))
    assert len(fine.token_ids) >= 2, "liveness: an id at the vocabulary's end is served"


@pytest.mark.parametrize("kwargs, parameter", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=2.5), "max_tokens"), (dict(max_tokens=True), "max_tokens"),
    (dict(temperature=-0.1), "temperature"), (dict(temperature="hot"), "temperature"), (dict(seed="7"), "seed"),
])
def test_invalid_sampling_params_name_the_parameter(kwargs, parameter):
    with pytest.raises(InvalidSamplingParams) as caught:
        SamplingParams(**kwargs)
    assert caught.value.parameter == parameter and str(caught.value).startswith(parameter)


def test_blocks_are_released_after_each_generation(engine):
    total = engine.kv_cache.num_blocks
    for _ in range(3):  # would run out of blocks if any generation leaked its allocation
        engine.generate(["a" * 100], SamplingParams(max_tokens=120, **GREEDY))
        assert engine.kv_cache.pool.num_free == total
