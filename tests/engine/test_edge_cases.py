"""Edge cases a review found: each once crashed, hung, refused valid work or touched global state."""

from __future__ import annotations

import json

import pytest
import torch

from engine import Engine, EngineConfig, RequestError, SamplingParams
from engine.loading.loader import ModelLoadError, load_model

pytestmark = pytest.mark.checkpoint(seed=4)
GREEDY = dict(temperature=0, ignore_eos=True)


def drain(engine: Engine) -> list:
    outputs = []
    for _ in range(500):  # bounded: a hang fails the test instead of the suite
        if not engine.has_unfinished_requests():
            return outputs
        outputs += engine.step()
    raise AssertionError("engine still busy after 500 steps")


@pytest.mark.parametrize("swap_blocks", [0, 8])
def test_a_sequence_that_fills_the_whole_pool_ends_with_length(checkpoint, swap_blocks):
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, num_kv_blocks=4, swap_blocks=swap_blocks))
    engine.add_request("r", list(range(100, 110)), SamplingParams(max_tokens=30, **GREEDY))
    last = drain(engine)[-1]
    # 10 + 7 tokens: 16 of them fed, filling the pool's 16 slots; the last one is never fed.
    assert last.finish_reason == "length" and last.usage.completion_tokens == 7
    assert engine.kv_cache.pool.num_free == 4


def test_a_tiny_temperature_samples_greedily_and_harms_no_neighbour(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint)))
    [greedy, tiny] = engine.generate(["x = 1", "x = 1"], [SamplingParams(max_tokens=6, **GREEDY),
                                                          SamplingParams(max_tokens=6, temperature=1e-45,
                                                                         ignore_eos=True)])
    assert tiny.finish_reason == greedy.finish_reason == "length" and tiny.token_ids == greedy.token_ids


def test_default_scheduler_reserves_only_the_slots_that_are_fed(checkpoint):
    # 8 prompt tokens + 9 new ones: 16 tokens are fed (the last sampled one never is), exactly the pool.
    engine = Engine(EngineConfig(model=str(checkpoint), scheduler="bucket", block_size=4, num_kv_blocks=4))
    [result] = engine.generate([list(range(100, 108))], SamplingParams(max_tokens=9, **GREEDY))
    assert result.finish_reason == "length" and len(result.token_ids) == 9


def test_unseeded_requests_leave_the_global_generator_alone(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint)))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    engine.add_request("r", "hello", SamplingParams(max_tokens=2))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("prompts, params, fragment", [
    ("hello", SamplingParams(), "prompts must be a list"),
    (["a", "b"], [SamplingParams(), None], "SamplingParams"),
    (["a", "b"], [SamplingParams()], "2 prompts but 1"),
])
def test_generate_refuses_bad_arguments_before_queuing_anything(checkpoint, prompts, params, fragment):
    engine = Engine(EngineConfig(model=str(checkpoint)))
    with pytest.raises(RequestError, match=fragment):
        engine.generate(prompts, params)
    assert not engine.has_unfinished_requests()
    assert engine.generate(["a"], SamplingParams(max_tokens=2, seed=0))[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("device, fragment", [("foo", "not a torch device"), ("cuda:0", "no CUDA device")])
def test_unusable_devices_are_refused_in_the_config(device, fragment):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match=fragment):
        EngineConfig(device=device)


@pytest.mark.parametrize("edit, fragment", [
    ({"rope_scaling": "linear"}, "rope_scaling must be an object"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"sliding_window": 0}, "sliding_window"),
])
def test_malformed_config_fields_are_named(checkpoint, edit, fragment):
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    config.pop("rope_parameters", None)
    path.write_text(json.dumps({**config, **edit}))
    with pytest.raises(ModelLoadError, match=fragment):
        load_model(checkpoint)


def test_a_malformed_tokenizer_config_names_its_file(checkpoint):
    (checkpoint / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="tokenizer_config.json: not valid JSON"):
        load_model(checkpoint)
