"""engine.sampler and engine.sampling_params: filters, penalties, seeds, logprobs and validation.

HF transformers' logits processors are the reference for what top-k, top-p, min-p and the repetition
penalty keep or change; the filters' effect is read from the probabilities `sample` hands to its draw
(engine/sampler.py's _probabilities), so the whole pipeline is checked, not a copy of it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from engine import sampler
from engine.sampler import SampleRequest, TokenLogprob, apply_penalties, sample
from engine.sampling_params import InvalidSamplingParams, SamplingParams
from tests.engine.sampler_reference import _penalised as penalised_per_row


def row(params: SamplingParams, seed: int | None = 0, prompt_ids=(), output_ids=()) -> SampleRequest:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return SampleRequest(params, list(prompt_ids), list(output_ids), generator)


def random_logits(seed: int, shape, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def hf_allowed(logits: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> set[int]:
    """Tokens HF's warpers (in HF's order) leave finite for one row of logits."""
    scores = logits.float().unsqueeze(0)
    input_ids = torch.zeros((1, 1), dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(input_ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(input_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(input_ids, scores)
    if min_p > 0.0:
        scores = MinPLogitsWarper(min_p)(input_ids, scores)
    return set(torch.isfinite(scores[0]).nonzero().flatten().tolist())


@pytest.fixture
def draw_probs(monkeypatch):
    """Records the probability vector each draw in `sample` is made from."""
    seen: list[torch.Tensor] = []
    real = sampler._probabilities

    def spy(*args, **kwargs):
        probs = real(*args, **kwargs)
        seen.append(probs.detach().clone())
        return probs

    monkeypatch.setattr(sampler, "_probabilities", spy)
    return seen


# --- greedy and degenerate filters -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.0, top_p=1e-6),
    SamplingParams(temperature=1.0, min_p=1.0),
], ids=["greedy", "top_k=1", "top_p=1e-6", "min_p=1"])
def test_greedy_and_degenerate_filters_pick_the_argmax(seed, params):
    logits = random_logits(seed, (6, 500), scale=1.0)  # flat enough that a real draw would stray
    tokens, records = sample(logits, [row(params, seed=seed * 10 + i) for i in range(6)])
    assert tokens == logits.argmax(dim=-1).tolist()
    assert records == [None] * 6


def test_the_row_argmax_is_torchs_on_ties_nans_and_infinities():
    """Greedy rows take the CPU's argmax through numpy (faster): it must pick what torch's argmax picks, the
    first of tied maxima, the first NaN, and index 0 for a row of -inf."""
    g = torch.Generator().manual_seed(4)
    scores = torch.randint(-3, 4, (64, 50), generator=g).float()  # many ties
    scores[5, 7] = scores[5, 30] = float("nan")
    scores[9] = float("-inf")
    scores[11, 2] = scores[11, 40] = float("inf")
    scores[13, :] = 0.0
    with torch.inference_mode():
        assert torch.equal(sampler._row_argmax(scores), scores.argmax(dim=-1))
        assert sampler._row_argmax(scores)[5] == 7 and sampler._row_argmax(scores)[9] == 0


def test_plain_sampling_is_not_the_argmax():
    """Liveness for the test above: at temperature 1 on the same logits the draws do stray."""
    logits = random_logits(0, (6, 500), scale=1.0)
    tokens, _ = sample(logits, [row(SamplingParams(temperature=1.0), seed=i) for i in range(6)])
    assert tokens != logits.argmax(dim=-1).tolist()


# --- top-k / top-p / min-p restrict the draw ---------------------------------------------------------

# A hand-built distribution: probabilities 0.40, 0.25, 0.15, 0.10, 0.06, 0.04 (shuffled over the ids so
# that "allowed" cannot mean "the lowest ids").
HAND_PROBS = torch.tensor([0.10, 0.40, 0.04, 0.15, 0.25, 0.06])
HAND_LOGITS = HAND_PROBS.log()


@pytest.mark.parametrize("filters, expected_size", [
    (dict(top_k=3), 3),
    (dict(top_k=4), 4),
    (dict(top_p=0.7), 3),   # masses before each (sorted): 0, .40, .65, .80 -> .40, .25, .15 kept
    (dict(top_p=0.5), 2),
    (dict(min_p=0.3), 3),   # floor 0.3 * 0.40 = 0.12 -> .40, .25, .15 kept
    (dict(min_p=0.2), 4),   # floor 0.08 -> .10 kept too
    (dict(top_k=4, top_p=0.7, min_p=0.5), 2),  # top-p leaves 3, min-p floor 0.20 leaves 2
])
def test_filters_never_draw_outside_the_allowed_set_and_reach_all_of_it(filters, expected_size):
    allowed = hf_allowed(HAND_LOGITS, **filters)
    # The reference set is what the probabilities above say it is: the largest `expected_size` tokens.
    assert allowed == set(torch.topk(HAND_PROBS, expected_size).indices.tolist())
    params = SamplingParams(temperature=1.0, **filters)
    generator = torch.Generator().manual_seed(1234)
    request = SampleRequest(params, [], [], generator)
    drawn = Counter(sample(HAND_LOGITS.unsqueeze(0), [request])[0][0] for _ in range(300))
    assert set(drawn) <= allowed, f"drew {set(drawn) - allowed} outside {allowed}"
    assert set(drawn) == allowed, f"never drew {allowed - set(drawn)} in 300 draws"


def test_unfiltered_sampling_reaches_every_token():
    """Liveness for the test above: with no filter the rare tokens do come up in 300 draws."""
    generator = torch.Generator().manual_seed(1234)
    request = SampleRequest(SamplingParams(temperature=1.0), [], [], generator)
    drawn = {sample(HAND_LOGITS.unsqueeze(0), [request])[0][0] for _ in range(300)}
    assert drawn == set(range(len(HAND_PROBS)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("filters", [
    dict(top_k=1), dict(top_k=7), dict(top_k=60),
    dict(top_p=0.1), dict(top_p=0.5), dict(top_p=0.9),
    dict(min_p=0.05), dict(min_p=0.2), dict(min_p=0.6),
    dict(top_k=40, top_p=0.8), dict(top_p=0.95, min_p=0.1), dict(top_k=30, top_p=0.9, min_p=0.05),
    dict(temperature=0.6, top_p=0.8), dict(temperature=1.7, top_p=0.8),
    dict(temperature=1.7, top_k=25, min_p=0.1), dict(temperature=0.4, min_p=0.02),
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_filters_keep_the_same_tokens_as_hf_warpers(seed, filters, draw_probs):
    logits = random_logits(seed, (300,), scale=2.0)
    reference = hf_allowed(logits, **filters)
    assert 1 <= len(reference) < logits.numel(), "the case must actually filter"
    params = SamplingParams(**{"temperature": 1.0, **filters})
    sample(logits.unsqueeze(0), [row(params, seed=seed)])
    [probs] = draw_probs
    assert set((probs > 0).nonzero().flatten().tolist()) == reference


def test_temperature_shapes_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0])
    target = torch.softmax(logits / 0.5, dim=-1)
    untempered = torch.softmax(logits, dim=-1)
    assert (target - untempered).abs().max() > 0.1, "temperature 0.5 must matter for this test to mean anything"
    request = row(SamplingParams(temperature=0.5), seed=7)
    draws = 4000
    counts = Counter(sample(logits.unsqueeze(0), [request])[0][0] for _ in range(draws))
    freq = torch.tensor([counts[i] / draws for i in range(4)])
    assert (freq - target).abs().max() < 0.03, (freq, target)


@pytest.mark.parametrize("vocab", [7, 4096, 49152])
@pytest.mark.parametrize("count", [1, 2, 5, 33])
def test_rows_with_only_a_temperature_share_a_softmax_with_each_rows_own_bits(vocab, count):
    # On the CPU such rows are drawn from one batched division and softmax: each must be the bits of the
    # row's own `_probabilities`, or a seeded request would draw another token beside other rows.
    temperatures = [0.05, 0.3, 0.7, 1.0, 1.3, 1.9, 2.0]
    rows = [row(SamplingParams(temperature=temperatures[k % len(temperatures)])) for k in range(count)]
    logits = random_logits(count * vocab, (count + 2, vocab), scale=4.0)
    indexes = list(range(1, count + 1))  # not the first row: the rows are gathered by index
    batched = sampler._temperature_probabilities(logits, indexes, [row(SamplingParams())] + rows)
    for k, index in enumerate(indexes):
        alone = sampler._probabilities(logits[index], rows[k].params)
        assert torch.equal(batched[k], alone), f"row {k} at temperature {rows[k].params.temperature}"


@pytest.mark.parametrize("temperatures", [[1.0] * 5, [1.0, 0.7, 1.0, 1.3, 1.0]])
def test_a_step_whose_every_row_has_only_a_temperature_keeps_each_rows_own_bits(temperatures):
    # The usual decode step: every row takes part, so none is gathered, and where all are at temperature 1
    # none is divided; each row must still be its own `_probabilities`, bit for bit.
    rows = [row(SamplingParams(temperature=t)) for t in temperatures]
    logits = random_logits(len(rows), (len(rows), 49152), scale=4.0)
    batched = sampler._temperature_probabilities(logits, list(range(len(rows))), rows)
    for k, request in enumerate(rows):
        assert torch.equal(batched[k], sampler._probabilities(logits[k], request.params)), f"row {k}"


def test_only_rows_without_penalties_or_cut_offs_share_the_softmax():
    shared = [SamplingParams(), SamplingParams(temperature=0.4), SamplingParams(temperature=1.5, top_p=1.0)]
    own = [SamplingParams(temperature=0), SamplingParams(top_k=5), SamplingParams(top_p=0.9),
           SamplingParams(min_p=0.1), SamplingParams(repetition_penalty=1.1), SamplingParams(presence_penalty=0.2)]
    assert all(sampler._temperature_only(p) for p in shared)
    assert not any(sampler._temperature_only(p) for p in own)


# --- penalties ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("penalty", [1.3, 0.7])
@pytest.mark.parametrize("seed", range(3))
def test_repetition_penalty_matches_hf(penalty, seed):
    vocab = 50
    logits = random_logits(seed, (vocab,))
    assert (logits > 0).any() and (logits < 0).any()
    g = torch.Generator().manual_seed(100 + seed)
    prompt_ids = torch.randint(0, vocab, (12,), generator=g).tolist()
    output_ids = torch.randint(0, vocab, (9,), generator=g).tolist()  # repeats and prompt overlap likely
    history = torch.tensor([prompt_ids + output_ids])
    expected = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.unsqueeze(0).clone())[0]
    before = logits.clone()
    ours = apply_penalties(logits, SamplingParams(repetition_penalty=penalty), prompt_ids, output_ids)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)
    assert torch.equal(logits, before), "apply_penalties must not change its input"
    assert not torch.equal(ours, logits)


@pytest.mark.parametrize("frequency, presence", [(0.5, 0.0), (0.0, 0.8), (0.7, 0.3), (-1.0, 1.5), (2.0, -2.0)])
def test_frequency_and_presence_penalties_count_output_tokens_only(frequency, presence):
    vocab = 40
    logits = random_logits(3, (vocab,))
    prompt_ids = [1, 2, 3, 3, 3, 9, 11]
    output_ids = [3, 5, 5, 5, 7, 9, 9, 20]
    params = SamplingParams(frequency_penalty=frequency, presence_penalty=presence)
    ours = apply_penalties(logits, params, prompt_ids, output_ids)
    counts = Counter(output_ids)
    for token in range(vocab):
        drop = frequency * counts[token] + presence * (counts[token] > 0)
        assert ours[token].item() == pytest.approx(logits[token].item() - drop, abs=1e-5), token
    for token in set(prompt_ids) - set(output_ids):
        assert ours[token].item() == logits[token].item()


def test_repetition_and_frequency_penalties_compose():
    """Repetition penalty (HF) on prompt + output, then the OpenAI-style penalties on output counts."""
    vocab = 30
    logits = random_logits(4, (vocab,))
    prompt_ids, output_ids = [0, 1, 2, 2], [2, 4, 4, 6]
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.25)
    expected = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([prompt_ids + output_ids]),
                                                     logits.unsqueeze(0).clone())[0]
    counts = Counter(output_ids)
    for token, count in counts.items():
        expected[token] -= 0.4 * count + 0.25
    torch.testing.assert_close(apply_penalties(logits, params, prompt_ids, output_ids), expected)


PENALTIES = [SamplingParams(repetition_penalty=1.3), SamplingParams(frequency_penalty=0.6, presence_penalty=-0.4),
             SamplingParams(repetition_penalty=0.7, frequency_penalty=-0.5, presence_penalty=0.9)]


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, 49), min_size=1, max_size=30),
       steps=st.lists(st.lists(st.integers(0, 49), min_size=1, max_size=3), min_size=1, max_size=12),
       which=st.sampled_from(range(len(PENALTIES))), seed=st.integers(0, 2**16))
def test_a_kept_penalty_history_penalises_each_step_as_one_rebuilt_from_the_lists(prompt, steps, which, seed):
    """A request's PenaltyHistory folds in the output added since its last step; at every step the
    penalised logits are bit for bit the per-row reference's, which reads the whole lists (output tokens
    repeating, and repeating the prompt's, one or several tokens a step)."""
    params, history, output = PENALTIES[which], sampler.PenaltyHistory(), []
    for step, added in enumerate(steps):
        output += added
        logits = random_logits(seed + step, (50,))
        kept = apply_penalties(logits, params, prompt, output, history)
        assert torch.equal(kept, penalised_per_row(logits, params, prompt, output)), f"step {step}"
        assert torch.equal(apply_penalties(logits, params, prompt, output, history), kept), "a second look, same step"


def test_a_penalty_history_given_another_requests_lists_starts_afresh():
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0)
    logits = random_logits(8, (20,))
    history = sampler.PenaltyHistory()
    apply_penalties(logits, params, [1, 2], [3, 3, 4], history)
    other_prompt, other_output = [5], [6, 6, 7, 7]  # more output than the first: no shrinking to notice
    assert torch.equal(apply_penalties(logits, params, other_prompt, other_output, history),
                       penalised_per_row(logits, params, other_prompt, other_output))


def test_greedy_with_penalties_takes_the_argmax_of_the_penalised_logits():
    logits = torch.tensor([[0.0, 3.0, 2.9, 1.0]])
    params = SamplingParams(temperature=0, repetition_penalty=1.2)
    # Token 1 was already generated: 3.0 / 1.2 = 2.5 < 2.9, so token 2 now wins; without the history, 1.
    assert sample(logits, [row(params, output_ids=[1])])[0] == [2]
    assert sample(logits, [row(params)])[0] == [1]
    expected = RepetitionPenaltyLogitsProcessor(1.2)(torch.tensor([[1]]), logits.clone()).argmax(-1).tolist()
    assert expected == [2]


# --- seeds and batches -------------------------------------------------------------------------------

def test_seeded_row_draws_the_same_alone_or_in_any_batch():
    vocab, steps, target_seed = 64, 25, 1234
    g = torch.Generator().manual_seed(0)
    target_logits = [torch.randn(vocab, generator=g) * 0.5 for _ in range(steps)]
    other_logits = [torch.randn(7, vocab, generator=g) * 2 for _ in range(steps)]
    target_params = SamplingParams(temperature=0.9, top_p=0.95)

    alone = row(target_params, seed=target_seed)
    alone_tokens = [sample(logits.unsqueeze(0), [alone])[0][0] for logits in target_logits]
    assert len(set(alone_tokens)) > 5, "the target row must really be sampling"

    def batch(seed_for_target):
        others = [
            row(SamplingParams(temperature=1.0), seed=1),
            row(SamplingParams(temperature=1.0, top_k=5), seed=2),
            row(SamplingParams(temperature=0)),
            row(SamplingParams(temperature=1.3), seed=None),  # unseeded
            row(SamplingParams(temperature=0, repetition_penalty=1.3), output_ids=[3, 4]),
            row(SamplingParams(temperature=0.7, logprobs=5, frequency_penalty=0.5), seed=None, output_ids=[1]),
            row(SamplingParams(temperature=1.0, min_p=0.1), seed=target_seed),  # same seed, other logits
        ]
        rows = others[:3] + [row(target_params, seed=seed_for_target)] + others[3:]
        tokens = []
        for step in range(steps):
            logits = torch.cat([other_logits[step][:3], target_logits[step].unsqueeze(0), other_logits[step][3:]])
            tokens.append(sample(logits, rows)[0][3])
        return tokens

    assert batch(target_seed) == alone_tokens
    assert batch(target_seed + 1) != alone_tokens


def test_different_seeds_give_different_sequences_and_equal_seeds_the_same():
    vocab, steps = 100, 30
    logits = random_logits(5, (vocab,), scale=0.3).unsqueeze(0)
    params = SamplingParams(temperature=1.0)

    def sequence(seed):
        request = row(params, seed=seed)
        return tuple(sample(logits, [request])[0][0] for _ in range(steps))

    sequences = [sequence(seed) for seed in range(5)]
    assert len(set(sequences)) == 5
    assert sequence(3) == sequences[3]


# --- logprobs ----------------------------------------------------------------------------------------

def test_logprob_records_describe_the_sampled_distribution():
    """After penalties and temperature (HF's processors as the reference), before the cut-offs; the
    confidence floor's value stays the model's own."""
    vocab = 80
    logits = random_logits(6, (5, vocab))
    rows = [
        row(SamplingParams(temperature=0, logprobs=5)),
        row(SamplingParams(temperature=0.8, top_k=10, logprobs=3), seed=1),
        row(SamplingParams(temperature=1.2, repetition_penalty=2.0, logprobs=20),
            seed=2, prompt_ids=[1, 2], output_ids=[2, 2, 7]),
        row(SamplingParams(temperature=1.0, logprobs=1), seed=3),
        row(SamplingParams(temperature=0, logprobs=2, repetition_penalty=1.5), output_ids=[0]),
    ]
    tokens, records = sample(logits, rows)
    raw = torch.log_softmax(logits.float(), dim=-1)
    input_ids = [[0], [0], [1, 2, 2, 2, 7], [0], [0]]
    for i, (token, record) in enumerate(zip(tokens, records)):
        params = rows[i].params
        scores = logits[i].float().unsqueeze(0)
        if params.repetition_penalty != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(
                torch.tensor([input_ids[i]]), scores)
        if not params.greedy:
            scores = TemperatureLogitsWarper(params.temperature)(torch.zeros((1, 1), dtype=torch.long), scores)
        reference = torch.log_softmax(scores[0], dim=-1)
        n = params.logprobs
        assert isinstance(record, TokenLogprob)
        assert record.token_id == token
        assert record.logprob == pytest.approx(reference[token].item(), abs=1e-5)
        assert record.model_logprob == pytest.approx(raw[i, token].item(), abs=1e-5)
        values, ids = torch.topk(reference, n)
        assert [t for t, _ in record.top] == ids.tolist()
        assert [v for _, v in record.top] == pytest.approx(values.tolist(), abs=1e-5)
        assert len(record.top) == n
        assert all(a[1] >= b[1] for a, b in zip(record.top, record.top[1:]))
    assert records[1].logprob != pytest.approx(raw[1, tokens[1]].item(), abs=1e-3)  # temperature counted


def test_frequency_penalty_changes_the_reported_logprobs():
    logits = random_logits(8, (1, 40))
    plain = sample(logits, [row(SamplingParams(temperature=0, logprobs=3))])[1][0]
    penalized = sample(logits, [row(SamplingParams(temperature=0, logprobs=3, frequency_penalty=2.0),
                                    output_ids=[plain.token_id] * 3)])[1][0]
    assert plain is not None and penalized is not None
    # the token the unpenalized row chose lost 6 nats of logit before the softmax
    penalized_top = dict(penalized.top)
    assert plain.token_id not in penalized_top or penalized_top[plain.token_id] < plain.logprob - 1
    assert penalized.model_logprob == pytest.approx(
        torch.log_softmax(logits[0], -1)[penalized.token_id].item(), abs=1e-5)


def test_logprob_records_only_when_asked():
    logits = random_logits(7, (4, 30))
    rows = [
        row(SamplingParams(temperature=0)),
        row(SamplingParams(temperature=1.0), seed=1),
        row(SamplingParams(temperature=1.0, logprobs=0), seed=2),
        row(SamplingParams(temperature=0, stop_below_prob=0.5)),
    ]
    tokens, records = sample(logits, rows)
    reference = torch.log_softmax(logits, dim=-1)
    assert records[0] is None and records[1] is None
    for i in (2, 3):
        assert records[i] is not None and records[i].top == ()
        assert records[i].token_id == tokens[i]
        assert records[i].logprob == pytest.approx(reference[i, tokens[i]].item(), abs=1e-5)


@pytest.mark.parametrize("batch, n_rows", [(2, 3), (3, 2), (1, 0)])
def test_rows_and_logits_must_match(batch, n_rows):
    with pytest.raises(ValueError):
        sample(torch.zeros(batch, 10), [row(SamplingParams(temperature=0)) for _ in range(n_rows)])


# --- SamplingParams validation ----------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("max_tokens", 0), ("max_tokens", 1.5), ("max_tokens", True),
    ("temperature", float("nan")), ("temperature", -0.1), ("temperature", 101), ("temperature", "1"),
    ("top_k", -1), ("top_k", 2.0),
    ("top_p", 0), ("top_p", 1.5), ("top_p", float("nan")),
    ("min_p", -0.1), ("min_p", 1.01),
    ("repetition_penalty", 0), ("repetition_penalty", -1.0), ("repetition_penalty", 11),
    ("frequency_penalty", 3), ("frequency_penalty", -2.5), ("presence_penalty", 2.01),
    ("seed", 1.0), ("seed", "7"),
    ("logprobs", 21), ("logprobs", -1), ("logprobs", True),
    ("stop", [f"s{i}" for i in range(17)]), ("stop", [""]), ("stop", ""), ("stop", ["x" * 257]),
    ("stop", ["ok", 3]), ("stop", None),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["1"]),
    ("ignore_eos", "yes"),
    ("stop_below_prob", 1.0), ("stop_below_prob", 0), ("stop_below_prob", float("nan")),
    ("tool_call_end", ""), ("tool_call_end", 5),
])
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams(**{field: value})
    assert info.value.parameter == field
    assert field in str(info.value)
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams.from_dict({field: value})
    assert info.value.parameter == field


@pytest.mark.parametrize("field, value", [
    ("temperature", 0), ("temperature", 100), ("top_p", 1.0), ("top_p", 1e-9), ("min_p", 0.0), ("min_p", 1.0),
    ("top_k", 0), ("repetition_penalty", 10), ("frequency_penalty", -2), ("presence_penalty", 2),
    ("logprobs", 0), ("logprobs", 20), ("stop", [f"s{i}" for i in range(16)]), ("stop", ["x" * 256]),
    ("stop_token_ids", [0, 5]), ("stop_below_prob", 0.999), ("tool_call_end", "</tool_call>"), ("seed", -3),
])
def test_boundary_values_are_accepted(field, value):
    SamplingParams(**{field: value})


def test_stop_and_stop_token_ids_are_frozen_to_tuples():
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(stop_token_ids=[4, 2]).stop_token_ids == (4, 2)
    params = SamplingParams.from_dict({"stop": ["END"], "stop_token_ids": [7], "temperature": 0.5})
    assert params.stop == ("END",) and params.stop_token_ids == (7,) and params.temperature == 0.5


def test_from_dict_refuses_unknown_keys_and_non_objects():
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams.from_dict({"temprature": 0})
    assert info.value.parameter == "temprature"
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams.from_dict({"temperature": 0, "best_of": 2})
    assert info.value.parameter == "best_of"
    for bad in ([], None, "temperature=0", [("temperature", 0)]):
        with pytest.raises(InvalidSamplingParams):
            SamplingParams.from_dict(bad)


def test_greedy_and_penalty_flags():
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0.01).greedy
    assert not SamplingParams().has_penalties
    for field in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        assert SamplingParams(**{field: 1.5}).has_penalties



def _seed_is_usable(seed):
    torch.Generator().manual_seed(SamplingParams(seed=seed).seed)  # what Engine.add_request does with it


@pytest.mark.parametrize("seed", [0, -3, 2**63 - 1, 2**64 - 1, -(2**63)])
def test_seeds_in_torch_range_are_accepted_and_usable(seed):
    assert SamplingParams(seed=seed).seed == seed
    _seed_is_usable(seed)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 2**70])
def test_out_of_range_seed_is_refused_as_a_sampling_param(seed):
    with pytest.raises(InvalidSamplingParams) as caught:
        SamplingParams(seed=seed)
    assert caught.value.parameter == "seed"


# --- extreme but valid parameters -------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_p=1e-300),  # below float32's smallest number: compares as 0
    SamplingParams(temperature=1.0, repetition_penalty=1e-300),  # a seen positive logit overflows to inf
], ids=["top_p=1e-300", "repetition_penalty=1e-300"])
def test_extreme_parameters_take_the_most_likely_token_and_leave_the_other_rows_alone(params):
    """Each used to make torch.multinomial raise, which failed the engine step for every sequence."""
    logits = random_logits(3, (3, 500))
    logits[1, 2] = 5.0  # a positive logit among the seen tokens
    plain = row(SamplingParams(temperature=1.0), seed=7)
    tokens, _ = sample(logits, [row(SamplingParams(temperature=0)), row(params, prompt_ids=[1, 2, 3]), plain])
    # In exact arithmetic both leave one token all the mass: the largest logit, penalised or not.
    exact = apply_penalties(logits[1].double(), params, [1, 2, 3], []) if params.has_penalties else logits[1]
    assert tokens[0] == int(logits[0].argmax())
    assert tokens[1] == int(exact.argmax())
    # The sampled row drew exactly what it draws alone.
    assert tokens[2] == sample(logits[2:], [row(SamplingParams(temperature=1.0), seed=7)])[0][0]


def test_nan_logits_still_fail_rather_than_sample_a_token():
    """The fallback above is for overflow only: a row of NaN (a numerical fault, a bad replay) must fail
    loudly, not quietly become token 0."""
    logits = random_logits(4, (2, 500))
    logits[1] = float("nan")
    with pytest.raises(RuntimeError):
        sample(logits, [row(SamplingParams(temperature=0)), row(SamplingParams(temperature=1.0))])
