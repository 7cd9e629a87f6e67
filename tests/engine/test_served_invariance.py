"""Every CPU configuration we serve is bit-invariant: SmolLM2 with its quantized weights in bfloat16 on our
native kernels (what `make run` serves), and its weights dequantized, in bfloat16 and in float32, give a
request the same greedy tokens and logprobs, bit for bit, alone, in one batch with eleven others, and while
a long prompt is prefilled in chunks beside it. (An HF directory's float weights take the dequantized
route: tests/engine/test_attention_invariance.py.)

A row's logits must not depend on who else is online: the quantized and the dense float matmuls reduce
each row in a fixed order whatever the row count (engine/kernels/cpu/qgemm.py, dense.py), and attention
reads each row's own keys in block
order whether they came from a decode, a whole prompt or a chunk (engine/kernels/cpu/paged_attention.py). Later
runs of the same prompt also hit the prefix cache, whose blocks must hold the same bits as a fresh
prefill's.
"""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.outputs import GenerationResult
from engine.sequence import RunningPrompt
from engine.kernels import cpu

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

QUESTIONS = ["What is a Python list?", "How do I read a file line by line?", "Explain recursion briefly.",
             "What is the capital of France?", "Write a haiku about the sea.", "Why is the sky blue?",
             "Give three tips for clean code.", "What does HTTP stand for?", "Name a prime number.",
             "What is 12 times 12?", "Translate 'good morning' to French.", "What is a dictionary?"]
PARAMS = SamplingParams(max_tokens=10, temperature=0, logprobs=3, ignore_eos=True)
CHUNK = 16  # prompt tokens a step may feed while anyone decodes: the long prompt goes in many chunks


CONFIGURATIONS = {"quantized-bf16": ("quantized", "bfloat16"), "dequantized-bf16": ("dequantized", "bfloat16"),
                  "dequantized-fp32": ("dequantized", "float32")}


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def engine(request, smollm2_gguf):
    if not cpu.native_available():
        pytest.skip(f"the served configuration's kernels are not built here: {cpu.unavailable_reason()}")
    weights, dtype = CONFIGURATIONS[request.param]
    return Engine(EngineConfig(model=str(smollm2_gguf), weights=weights, dtype=dtype,
                               max_prefill_beside_decodes=CHUNK, max_model_len=2048))


def answer(result) -> tuple:
    """Tokens and every logprob record's floats, exactly."""
    return tuple(result.token_ids), tuple((r.token_id, r.logprob, r.top, r.model_logprob) for r in result.logprobs)


def beside_a_chunked_prompt(engine: Engine, prompts: list[list[int]]) -> tuple[dict[str, tuple], int]:
    """The prompts decoding while a long prompt arrives; returns their answers and the number of steps
    the long prompt spent being prefilled (its chunks)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"q{i}", prompt, PARAMS)
    deltas: dict[str, list] = {}
    long_prompt = engine.tokenizer.encode_chat([{"role": "user", "content": " ".join(QUESTIONS * 4)}])
    chunk_steps = 0
    for step in range(1000):
        if step == 2:  # the twelve are decoding now
            engine.add_request("long", long_prompt, SamplingParams(max_tokens=2, temperature=0))
        for output in engine.step():
            deltas.setdefault(output.request_id, []).append(output)
        chunk_steps += any(s.request_id == "long" and isinstance(s.state, RunningPrompt)
                           for s in engine.live_sequences())
        if not engine.has_unfinished_requests():
            break
    return {rid: answer(GenerationResult.from_deltas(d)) for rid, d in deltas.items() if rid != "long"}, chunk_steps


def test_a_requests_tokens_and_logprobs_are_the_same_bits_alone_batched_and_beside_a_chunked_prompt(engine):
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    alone = [answer(engine.generate([p], PARAMS)[0]) for p in prompts]
    together = [answer(r) for r in engine.generate(prompts, PARAMS)]
    beside, chunk_steps = beside_a_chunked_prompt(engine, prompts)
    assert chunk_steps > 5, "liveness: the long prompt was prefilled in chunks beside the decodes"
    assert len({a[0] for a in alone}) > 1, "liveness: the prompts get different answers"
    for i, solo in enumerate(alone):
        assert together[i] == solo, f"{QUESTIONS[i]!r}: batched differs from alone"
        assert beside[f"q{i}"] == solo, f"{QUESTIONS[i]!r}: beside a chunked prompt differs from alone"
