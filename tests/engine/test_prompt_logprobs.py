"""Prompt logprobs (SamplingParams.prompt_logprobs): each prompt token's logprob under the model, from the prefill.

What must hold: the values are a plain full forward's (the model over the whole prompt, log-softmax at
each position); they are the same bits whether the request runs alone or batched with others, whether
its prompt is prefilled whole or in chunks, and whether its prefix was cached before (a cached prefix
has no logits: such a request computes its whole prompt, and still leaves its blocks for others to
find); a request that does not ask gets none and its answer does not change.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.decode import prompt_logprobs
from engine.sampling_params import InvalidSamplingParams

PROMPT = [(13 * i) % 2900 + 7 for i in range(37)]  # 37 tokens: nine full blocks of 4 and one token
OTHERS = [[11, 12, 13], [(5 * i) % 1000 + 3 for i in range(20)], [400, 401]]
ASKS = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=4, ignore_eos=True)
PLAIN = SamplingParams(max_tokens=6, temperature=0.8, seed=7, ignore_eos=True)


def make(checkpoint, **overrides) -> Engine:
    config = dict(model=str(checkpoint), block_size=4, num_kv_blocks=200, device_loop=False, graphs=False)
    return Engine(EngineConfig(**{**config, **overrides}))


def bits(result) -> list[tuple]:
    """Every prompt record's floats, exactly (the first prompt token has none)."""
    assert result.prompt_logprobs[0] is None
    return [(r.token_id, r.logprob, r.top) for r in result.prompt_logprobs[1:]]


@torch.no_grad()
def reference(engine: Engine, prompt: list[int]) -> torch.Tensor:
    """log_softmax of a plain full forward over the prompt: [len - 1, V], row p for token p + 1."""
    model = engine.loaded.model
    ids = torch.tensor([prompt])
    logits = model.logits(model(ids, torch.arange(ids.shape[1])[None]))[0]
    return torch.log_softmax(logits.float(), dim=-1)[:-1]


def test_prompt_logprobs_are_a_full_forwards_log_softmax(checkpoint):
    engine = make(checkpoint)
    [result] = engine.generate([PROMPT], ASKS)
    expected = reference(engine, PROMPT)
    records = result.prompt_logprobs[1:]
    assert len(records) == len(PROMPT) - 1
    assert [r.token_id for r in records] == PROMPT[1:]
    got = torch.tensor([r.logprob for r in records])
    want = expected.gather(1, torch.tensor(PROMPT[1:])[:, None]).flatten()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    for position, record in enumerate(records):
        assert len(record.top) == 4
        top_values = torch.tensor([value for _, value in record.top])
        torch.testing.assert_close(top_values, expected[position].topk(4).values, atol=1e-4, rtol=0)
    assert result.usage.prompt_tokens == len(PROMPT) and len(result.token_ids) == 3


def test_the_same_bits_alone_batched_chunked_and_after_a_cached_prefix(checkpoint):
    alone = bits(make(checkpoint).generate([PROMPT], ASKS)[0])
    batched = make(checkpoint).generate([*OTHERS, PROMPT], [PLAIN] * len(OTHERS) + [ASKS])[-1]
    assert bits(batched) == alone, "batched with others"

    chunked_engine = make(checkpoint, max_num_batched_tokens=8)
    chunked_engine.add_request("other", OTHERS[1], PLAIN)
    chunked_engine.step()
    chunked_engine.add_request("asks", PROMPT, ASKS)
    deltas = []
    steps_before_first_token = 0
    while chunked_engine.has_unfinished_requests():
        outputs = [o for o in chunked_engine.step() if o.request_id == "asks"]
        steps_before_first_token += not deltas and not outputs
        deltas += outputs
    assert steps_before_first_token > 3, "liveness: the prompt was prefilled in several chunks"
    assert [(r.token_id, r.logprob, r.top) for r in deltas[0].prompt_logprobs[1:]] == alone, "chunked"
    assert all(d.prompt_logprobs is None for d in deltas[1:]), "the prompt's records come once, on the first delta"

    cached_engine = make(checkpoint, prefix_caching=True)
    warm = SamplingParams(max_tokens=2, temperature=0)
    cached_engine.generate([PROMPT], warm)  # its blocks are cached now
    [after] = cached_engine.generate([PROMPT], ASKS)
    assert bits(after) == alone, "after the same prompt was cached"
    assert after.usage.cached_tokens == 0, "a request asking for prompt logprobs computes its whole prompt"
    [plain] = cached_engine.generate([PROMPT], warm)
    assert plain.usage.cached_tokens == 36, "liveness: the cache served the same prompt to a request not asking"


def test_a_request_not_asking_gets_none_and_the_same_answer(checkpoint):
    engine = make(checkpoint)
    [alone] = engine.generate([OTHERS[1]], PLAIN)
    [beside, _] = engine.generate([OTHERS[1], PROMPT], [PLAIN, ASKS])
    assert alone.prompt_logprobs is None and beside.prompt_logprobs is None
    assert beside.token_ids == alone.token_ids


def test_bad_values_are_refused_by_name():
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(InvalidSamplingParams, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)


def test_a_one_token_prompt_has_only_the_null_record(checkpoint):
    [result] = make(checkpoint).generate([[42]], ASKS)
    assert result.prompt_logprobs == [None]


@pytest.mark.parametrize("swap_blocks", [0, 64], ids=["recompute", "swap"])
def test_a_preemption_mid_prefill_neither_repeats_nor_shifts_a_record(checkpoint, swap_blocks):
    """Preempted between two chunks, the prompt is prefilled again (recompute) or resumed (swap): the
    records it had are kept and the rest follow them, as alone."""
    long_prompt = [(7 * i) % 3000 + 5 for i in range(150)]
    alone = bits(make(checkpoint).generate([long_prompt], ASKS)[0])
    # 48 blocks of 4: the long prompt needs 38, and the short request growing pushes it out mid-prefill.
    engine = make(checkpoint, num_kv_blocks=48, max_num_batched_tokens=8, swap_blocks=swap_blocks)
    stood_down: list[str] = []
    engine.stand_down_listeners.append(lambda seq: stood_down.append(f"{seq.request_id}:{type(seq.state).__name__}"))
    engine.add_request("short", list(range(20, 56)), SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    engine.step()
    engine.add_request("long", long_prompt, ASKS)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [o for o in engine.step() if o.request_id == "long"]
    assert any(s.startswith("long:") and not s.endswith("Done") for s in stood_down), \
        f"liveness: the long prefill was preempted: {stood_down}"
    assert [(r.token_id, r.logprob, r.top) for r in deltas[0].prompt_logprobs[1:]] == alone


def test_a_chunk_that_starts_before_the_records_so_far_reads_its_own_positions():
    """A prefill again from the start (recompute) whose chunk straddles the records collected: the
    positions it still needs are read at their own rows of the chunk's hidden states."""
    seq = SimpleNamespace(num_cached=2, prompt_ids=[0, 1, 2, 3, 4, 5, 6, 7], prompt_logprobs=[None] * 4,
                          wants_prompt_logits=True)
    assert prompt_logprobs.wanted_positions(seq, 4) == range(4, 6)  # the chunk feeds positions 2..5
    hidden = torch.full((4, 8), -10.0)
    hidden[torch.arange(4), torch.tensor([3, 4, 5, 6])] = 10.0  # row r (position 2 + r) predicts token 3 + r
    records = prompt_logprobs.records(lambda rows: rows, hidden, seq, range(4, 6), top=1)
    assert [r.token_id for r in records] == [5, 6]
    assert all(r.top[0][0] == r.token_id and r.logprob > -1e-6 for r in records), records


def test_the_same_bits_on_the_served_route(tiny_gguf, native_cpu_kernels):
    """`make run`'s route (quantized weights, bfloat16 activations, the fused layer on our native
    kernels): alone, batched, and prefilled in chunks beside a decode."""
    path, _ = tiny_gguf("llama", "Q4_1", seed=3, embedding_qtype="Q8_0")
    served = dict(weights="quantized", dtype="bfloat16")
    alone_engine = make(path, **served)
    assert alone_engine.loaded.model.fused is not None, "liveness: the fused route serves it"
    alone = bits(alone_engine.generate([PROMPT], ASKS)[0])
    assert bits(make(path, **served).generate([*OTHERS, PROMPT], [PLAIN] * len(OTHERS) + [ASKS])[-1]) == alone
    chunked = make(path, max_num_batched_tokens=8, **served)
    chunked.add_request("other", OTHERS[1], PLAIN)
    chunked.step()
    chunked.add_request("asks", PROMPT, ASKS)
    first = None
    while chunked.has_unfinished_requests():
        outputs = [o for o in chunked.step() if o.request_id == "asks"]
        first = first or (outputs[0] if outputs else None)
    assert first is not None and [(r.token_id, r.logprob, r.top) for r in first.prompt_logprobs[1:]] == alone
