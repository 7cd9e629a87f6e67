"""The batched sampler (engine/sampler.py) against the per-row one it replaced
(tests/engine/sampler_reference.py): for seeded requests of every parameter kind, alone and in mixed
batches, over several steps whose outputs feed the penalties and advance the grammars, the same tokens,
the same logprob records and the same generator states afterwards, bit for bit. On a GPU the same
comparison runs on CUDA, and the batch waits for the device once.
"""

from __future__ import annotations

import importlib.util
import random
import warnings

import pytest
import torch

from engine.grammar import GrammarTokenizer
from engine.loading.model_files import DEMO_MODEL_DIR, load_tokenizer
from engine.sampler import SampleRequest, apply_penalties, sample
from engine.sampling_params import SamplingParams
from tests.engine.sampler_reference import sample_per_row

VOCAB = 4096  # the demo tokenizer's, so that a real grammar masks real tokens
EOS = 2
KINDS: dict[str, SamplingParams] = {
    "greedy": SamplingParams(temperature=0),
    "greedy, penalised": SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.4),
    "temperature": SamplingParams(temperature=0.7),
    "hot": SamplingParams(temperature=1.9),
    "top_k": SamplingParams(top_k=20),
    "top_k=1": SamplingParams(top_k=1),
    "top_p": SamplingParams(top_p=0.9),
    "top_p=1e-6": SamplingParams(top_p=1e-6),
    "min_p": SamplingParams(min_p=0.05),
    "every filter": SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.02),
    "repetition": SamplingParams(repetition_penalty=1.2),
    "frequency, presence": SamplingParams(frequency_penalty=0.5, presence_penalty=0.3, top_p=0.97),
    "logprobs": SamplingParams(temperature=0.9, logprobs=5),
    "greedy logprobs": SamplingParams(temperature=0, logprobs=3, presence_penalty=0.8),
    "confidence floor": SamplingParams(temperature=1.1, stop_below_prob=0.01),
    # Overflows float32 (logits / 1e-300 is inf): the row is drawn again in float64.
    "overflowing penalty": SamplingParams(repetition_penalty=1e-300, logprobs=2),
    "min_tokens": SamplingParams(temperature=1.2, min_tokens=4),
}
# A response_format is refused where llguidance is absent (the GPU machine's image, unless its wheel
# was carried), and this module must still be collected there.
HAS_LLGUIDANCE = importlib.util.find_spec("llguidance") is not None
if HAS_LLGUIDANCE:
    KINDS["grammar"] = SamplingParams(temperature=1.0, response_format={"type": "regex", "regex": "[0-9]{3}-[a-z]{2}"})
PROMPT = [5, 17, 301, 17, 999]


@pytest.fixture(scope="module")
def grammars() -> GrammarTokenizer | None:
    return GrammarTokenizer(load_tokenizer(DEMO_MODEL_DIR), VOCAB, frozenset({0, EOS})) if HAS_LLGUIDANCE else None


class Stream:
    """One request's state as the engine keeps it: its history, generator and grammar."""

    def __init__(self, kind: str, seed: int, grammars: GrammarTokenizer | None, device: str) -> None:
        self.params = KINDS[kind]
        self.output: list[int] = []
        self.generator = torch.Generator(device=device).manual_seed(seed)
        grammar = self.params.grammar
        self.constraint = None
        if grammar is not None:
            assert grammars is not None, "the grammar kind exists only where llguidance is installed"
            self.constraint = grammars.constraint(grammar)

    def request(self) -> SampleRequest:
        suppressed = (0, EOS) if len(self.output) < self.params.min_tokens else ()
        return SampleRequest(self.params, PROMPT, list(self.output), self.generator, self.constraint, suppressed)

    def commit(self, token: int) -> None:
        self.output.append(token)
        if self.constraint is not None:
            self.constraint.advance(token)


def step_logits(seed: int, rows: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, VOCAB, generator=generator) * 3).to(device)


def run_both(kinds: list[str], grammars: GrammarTokenizer | None, device: str = "cpu", steps: int = 6):
    """Both samplers on twin streams (equal seeds) for `steps` steps; asserts each step agrees and
    returns the tokens each stream drew."""
    batched = [Stream(kind, 100 + i, grammars, device) for i, kind in enumerate(kinds)]
    per_row = [Stream(kind, 100 + i, grammars, device) for i, kind in enumerate(kinds)]
    for step in range(steps):
        logits = step_logits(step, len(kinds), device)
        got = sample(logits, [s.request() for s in batched])
        expected = sample_per_row(logits, [s.request() for s in per_row])
        assert got == expected, f"step {step} of {kinds}"
        for stream, twin, token in zip(batched, per_row, got[0]):
            stream.commit(token)
            twin.commit(token)
    for stream, twin in zip(batched, per_row):
        assert torch.equal(stream.generator.get_state(), twin.generator.get_state()), stream.params
    return [s.output for s in batched]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_alone_draws_what_the_per_row_sampler_draws(kind, grammars):
    run_both([kind], grammars)


@pytest.mark.parametrize("order", range(3))
def test_mixed_batches_draw_what_the_per_row_sampler_draws(order, grammars):
    kinds = list(KINDS) * 2
    random.Random(order).shuffle(kinds)
    outputs = run_both(kinds, grammars)
    logits = [step_logits(step, len(kinds), "cpu") for step in range(6)]
    sampled = [i for i, kind in enumerate(kinds) if kind in ("temperature", "hot", "top_p", "min_p")]
    strays = sum(outputs[i][step] != int(logits[step][i].argmax()) for i in sampled for step in range(6))
    assert strays > len(sampled), "liveness: the sampled rows really draw (not their argmax)"


def test_an_overflowing_row_needs_float64(grammars):
    """Liveness of the "overflowing penalty" kind: in float32 its penalised logits are not finite."""
    params = KINDS["overflowing penalty"]
    assert not torch.isfinite(apply_penalties(step_logits(0, 1, "cpu")[0], params, PROMPT, [])).all()


def test_nan_logits_fail_the_step_in_both_and_the_batched_one_draws_nothing(grammars):
    """The engine then samples each row alone (engine/step_recovery.py), so the failed step must leave every
    generator as it found it. The per-row sampler did not: the rows before the failing one had drawn."""
    logits = step_logits(0, 3, "cpu")
    logits[1, 7] = float("nan")
    for sampler in (sample, sample_per_row):
        rows = [Stream(kind, i, grammars, "cpu").request() for i, kind in enumerate(["temperature", "top_p", "hot"])]
        before = [row.generator.get_state() for row in rows]
        with pytest.raises(RuntimeError, match="probability tensor"):
            sampler(logits, rows)
        untouched = [torch.equal(row.generator.get_state(), state) for row, state in zip(rows, before)]
        assert untouched == ([True] * 3 if sampler is sample else [False, True, True])


def cuda_waits(kinds: list[str], grammars) -> list[str]:
    """The device waits torch reports while one step of `kinds` is sampled on CUDA."""
    streams = [Stream(kind, i, grammars, "cuda") for i, kind in enumerate(kinds)]
    logits = step_logits(0, len(kinds), "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sample(logits, [s.request() for s in streams])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


@pytest.mark.gpu
def test_on_cuda_the_batch_draws_the_same_and_waits_once(grammars):
    run_both(list(KINDS), grammars, device="cuda")
    # Logprob records are read back in a wait of their own (the next test), and an overflowing row is drawn again.
    plain = [k for k, p in KINDS.items() if p.logprobs is None and p.stop_below_prob is None
             and p.repetition_penalty > 1e-3]
    assert "greedy, penalised" in plain and "frequency, presence" in plain and "min_tokens" in plain
    waits = cuda_waits(plain, grammars)
    assert len(waits) == 1, waits


@pytest.mark.gpu
def test_on_cuda_logprob_records_cost_one_more_wait(grammars):
    """Every row's record (values, top ids and the overflow check) comes back in one read after the
    tokens'; only a row whose penalised logits overflow float32 costs a third (its float64 redo)."""
    kinds = [k for k in KINDS if k != "overflowing penalty"]
    assert any(KINDS[k].logprobs for k in kinds) and any(KINDS[k].stop_below_prob for k in kinds)
    waits = cuda_waits(kinds, grammars)
    assert len(waits) == 2, waits
