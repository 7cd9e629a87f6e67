"""The fused serving route (engine/model/fused_serving.py): which models take it, that it tracks the exact
model, and that a request's tokens and logprobs are the same bits alone, batched and beside a prompt
prefilled in chunks. On tiny random GGUF models; tests/engine/test_served_invariance.py does the same on
SmolLM2. Skipped where the native kernels cannot be built."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf", reason="gguf (the ggml block formats) is not installed")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.loading.loader import load_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("native_cpu_kernels")

SERVED = {"weights": "quantized", "dtype": "bfloat16"}
PROMPTS = ["def main():", "The quick brown fox", "import os\nimport sys\n", "é ü 漢字 🙂", "for i in range(10):"]


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_quantized_bfloat16_model_takes_the_fused_route(tiny_gguf, model_type):
    path, _ = tiny_gguf(model_type, "Q4_1", seed=1, embedding_qtype="Q8_0")
    model = load_model(path, **SERVED).model
    assert model.fused is not None and all(layer.fused is not None for layer in model.model.layers)


def test_float_models_and_the_switch_keep_the_module_route(tiny_gguf, monkeypatch):
    path, _ = tiny_gguf("llama", "Q4_1", seed=2, embedding_qtype="Q8_0")
    assert load_model(path, weights="dequantized", dtype="bfloat16").model.fused is None
    assert load_model(path, weights="quantized", dtype="float32").model.fused is None  # the exact reference route
    monkeypatch.setenv("WORKBENCH_FUSED_LAYERS", "off")
    assert load_model(path, **SERVED).model.fused is None


@pytest.mark.parametrize("model_type,qtype", [("llama", "Q4_0"), ("llama", "Q8_0"), ("qwen2", "Q4_1")])
def test_the_fused_route_tracks_the_exact_model(tiny_gguf, model_type, qtype):
    """While its greedy tokens agree with the exact fp32 model's, each step's top-5 logprobs are within
    0.15 of the exact model's (seen: at most 0.06; the weights are the same, the error is the int8
    activations and the bfloat16 KV cache). Random tiny models are full of near-ties, so the tokens
    themselves may part: at least the first must agree."""
    path, _ = tiny_gguf(model_type, qtype, seed=5, embedding_qtype="Q8_0")
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=5, ignore_eos=True)
    fused_engine = Engine(EngineConfig(model=str(path), **SERVED))
    assert fused_engine.runner.loaded.model.fused is not None, "liveness: the fused route serves"
    fused = fused_engine.generate(PROMPTS, params)
    exact = Engine(EngineConfig(model=str(path), weights="dequantized", dtype="float32")).generate(PROMPTS, params)
    for prompt, ours, reference in zip(PROMPTS, fused, exact):
        assert ours.token_ids[0] == reference.token_ids[0], prompt
        for mine, theirs in zip(ours.logprobs, reference.logprobs):
            top = dict(theirs.top)
            assert all(abs(logprob - top[token]) <= 0.15 for token, logprob in mine.top if token in top), prompt
            if mine.token_id != theirs.token_id:
                break


def answer(result) -> tuple:
    return tuple(result.token_ids), tuple((r.token_id, r.logprob, r.top) for r in result.logprobs)


def test_a_requests_answer_is_the_same_bits_alone_batched_and_beside_a_chunked_prompt(tiny_gguf):
    path, _ = tiny_gguf("qwen2", "Q4_1", seed=6, embedding_qtype="Q8_0")
    engine = Engine(EngineConfig(model=str(path), max_prefill_beside_decodes=4, **SERVED))
    assert engine.runner.loaded.model.fused is not None, "liveness: the fused route serves"
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=3, ignore_eos=True)
    alone = [answer(engine.generate([p], params)[0]) for p in PROMPTS]
    assert [answer(r) for r in engine.generate(PROMPTS, params)] == alone
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"q{i}", engine.tokenizer.encode(prompt), params)
    outputs: dict[str, list] = {}
    for step in range(500):
        if step == 2:  # the five decode now; the long prompt goes in chunks of 4 beside them
            engine.add_request("long", engine.tokenizer.encode(" ".join(PROMPTS * 6)), params)
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        if not engine.has_unfinished_requests():
            break
    from engine.outputs import GenerationResult

    beside = [answer(GenerationResult.from_deltas(outputs[f"q{i}"])) for i in range(len(PROMPTS))]
    assert beside == alone
    assert len({a[0] for a in alone}) > 1, "liveness: the prompts get different answers"
