"""A forward that raises for one row of a batch errors that row's request only:
the engine runs the failed step's rows one by one, and every other request ends as it would alone."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.decode.runner import ModelRunner
from tests import reference
from tests.engine.test_funnel import assert_pool_whole

PROMPTS = ["def parse(text):", "class Stack:", "import os\n", "for item in"]
POISON = "poisoned row"
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(params=[False, True], ids=["host-decode", "device-loop"])
def device_loop(request) -> bool:
    return request.param


def test_only_the_row_whose_forward_raises_errors(tiny_checkpoint, device_loop, monkeypatch):
    checkpoint = tiny_checkpoint("llama", seed=11)
    solo = {p: reference.solo(checkpoint, p, GREEDY, device_loop=device_loop) for p in PROMPTS}
    engine = Engine(EngineConfig(model=str(checkpoint), block_size=4, device_loop=device_loop))
    real_forward, real_run, batched_with_poison = ModelRunner.forward, ModelRunner.run, []

    def poisoned(runner, seqs, *chunking):  # chunking: each row's feeds and which rows sample
        if any(POISON in runner.loaded.tokenizer.decode(s.prompt_ids) for s in seqs):
            raise RuntimeError("injected")
        return real_forward(runner, seqs, *chunking)

    def step_batches(runner, batch, requests):  # the step's whole batch (some rows may be parked or burst)
        if any(POISON in runner.loaded.tokenizer.decode(s.prompt_ids) for s in batch.sequences):
            batched_with_poison.append(len(batch.sequences))
        return real_run(runner, batch, requests)

    monkeypatch.setattr(ModelRunner, "forward", poisoned)
    monkeypatch.setattr(ModelRunner, "run", step_batches)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, GREEDY)
    outputs: dict[str, list] = {}
    for step in range(200):
        if step == 3:  # the others are decoding (in bursts, with the device loop) when it arrives
            engine.add_request("poison", f"a {POISON} here", GREEDY)
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        if not engine.has_unfinished_requests():
            break
    assert max(batched_with_poison) > 1, "liveness: the poisoned row was batched with the others"
    last = outputs["poison"][-1]
    assert last.finished and last.finish_reason == "error" and "injected" in last.error
    for i, prompt in enumerate(PROMPTS):
        tokens = [t for out in outputs[f"r{i}"] for t in out.token_ids]
        assert outputs[f"r{i}"][-1].finish_reason == "length" and tokens == solo[prompt], f"r{i} differs from solo"
    assert_pool_whole(engine)
