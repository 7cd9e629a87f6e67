"""An engine whose model serves on the Triton backend, on the CPU under Triton's interpreter: what a CUDA
engine's steps run (LlamaForCausalLM._triton_step: RoPE + cache write, the paged decode kernel, every norm
a row kernel, the MLP's activation and multiply one kernel), end to end through the real scheduler,
graphs' replay backend and preemption, before any GPU runs it.

- The batch-invariance oracle (tests/engine/test_batch_invariance.py's, on a smaller workload: the
  interpreter is slow): each request gets its solo run's tokens and their logprobs exactly, the last
  bits included, nothing forgiven. Prefix caching off and preemption by swap, so each prompt
  is prefilled whole in both runs (as in the gpu-marked oracle in tests/engine/test_gpu.py).
- Prompts chunked and prefixes found in the cache (prefills after cached keys, beside decodes): their
  first token's top logprobs within 1e-4 of the torch backend's (the values, sorted: a near-tie may order
  two ids otherwise).
"""

from __future__ import annotations

import random

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.kernels import triton_interpreter

INTERPRETED = triton_interpreter.select()  # before triton is first imported

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="a CUDA device is here: tests/engine/test_gpu.py runs it compiled")


def engine_on(backend: str, **config) -> Engine:
    engine = Engine(EngineConfig(**config))
    engine.loaded.model.set_decode_attention(backend)
    return engine


def small_workload(rng: random.Random) -> list[tuple[str, list[int], SamplingParams]]:
    """Six requests of 2-16 prompt tokens: greedy ones and seeded sampled ones (every third)."""
    requests = []
    for i in range(6):
        prompt = [rng.randrange(5, 4000) for _ in range(rng.randint(2, 16))]
        sampled = dict(temperature=0.8, top_p=0.9, seed=100 + i) if i % 3 == 2 else dict(temperature=0)
        requests.append((f"req-{i}", prompt, SamplingParams(max_tokens=rng.randint(4, 10), ignore_eos=True, logprobs=1,
                                                            **sampled)))
    return requests


def test_every_request_gets_its_solo_tokens_on_the_triton_backend(tiny_checkpoint):
    from tests.engine.test_batch_invariance import run_mixed

    rng = random.Random(7)
    requests = small_workload(rng)
    base = dict(model=str(tiny_checkpoint("llama", seed=21, num_hidden_layers=1)), block_size=4,
                prefix_caching=False)
    alone = engine_on("triton", **base)
    solo = {}
    for rid, prompt, params in requests:
        [result] = alone.generate([prompt], params)
        solo[rid] = [(lp.token_id, lp.logprob) for lp in result.logprobs]
    # No device loop: it takes no rows that ask for logprobs, and the logprobs are what shows the last bits.
    engine = engine_on("triton", **base, num_kv_blocks=10, swap_blocks=64, graphs=True)
    aborts = {"req-4": 3}
    deltas = run_mixed(engine, requests, aborts, rng)
    for rid, _, _ in requests:
        got = [(lp.token_id, lp.logprob) for delta in deltas[rid] for lp in delta.logprobs or ()]
        assert got == (solo[rid][: len(got)] if rid in aborts else solo[rid]), rid
    assert engine.scheduler.num_preemptions > 0, "liveness: the small pool swapped sequences out"
    assert engine.runner.graphs.replays > 0, "liveness: decode steps replayed graphs"


def test_chunked_prompts_and_cached_prefixes_on_the_triton_backend_match_the_torch_backend(tiny_checkpoint):
    checkpoint = str(tiny_checkpoint("llama", seed=22, num_hidden_layers=1))
    shared = list(range(40, 80))  # ten blocks that the later prompts find cached
    prompts = [shared + [5, 6, 7], shared + list(range(100, 137)), list(range(200, 260)), shared + [9]]
    params = SamplingParams(max_tokens=3, temperature=0, logprobs=5, ignore_eos=True)
    tops = {}
    for backend in ("torch", "triton"):
        engine = engine_on(backend, model=checkpoint, block_size=4, max_num_batched_tokens=24)
        first = engine.generate(prompts[:1], params)  # its blocks cached for the others
        results = first + engine.generate(prompts[1:], params)
        tops[backend] = [sorted(value for _, value in result.logprobs[0].top) for result in results]
        assert engine.scheduler.prefix_hits > 0, "liveness: later prompts found the first one's blocks"
    for ours, theirs in zip(tops["triton"], tops["torch"]):
        assert ours == pytest.approx(theirs, abs=1e-4)
