"""The CPU's sampled rows draw exactly what torch.multinomial draws, and leave the generator where it does."""

import threading

import pytest
import torch

from engine import sampling_draws


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _multinomial(probs: torch.Tensor, seed: int) -> tuple[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return int(torch.multinomial(probs, 1, generator=generator)), generator.get_state()


def _ours(probs: torch.Tensor, seed: int) -> tuple[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return sampling_draws.draw(probs, generator), generator.get_state()


def _rows() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    vocab = 4099
    peaked = torch.softmax(torch.randn(vocab) * 4, dim=-1)
    top_k = torch.softmax(torch.randn(vocab), dim=-1)
    top_k[torch.randperm(vocab)[:vocab - 40]] = 0.0
    return {"peaked": peaked, "flat": torch.full((vocab,), 1.0 / vocab), "top-k": top_k,
            "one token": torch.nn.functional.one_hot(torch.tensor(17), vocab).float()}


@pytest.mark.parametrize("kind", list(_rows()))
def test_each_row_draws_multinomials_token_and_leaves_its_generator_as_multinomial_does(kind):
    probs = _rows()[kind]
    for seed in range(40):
        token, state = _ours(probs, seed)
        expected, expected_state = _multinomial(probs, seed)
        assert token == expected, (kind, seed)
        assert torch.equal(state, expected_state), (kind, seed)


def test_scores_tied_to_the_last_bits_are_settled_as_the_exact_argmax_settles_them():
    # Probabilities proportional to the very noise the seed will draw: every score is the same number up
    # to rounding, so many are candidates and only the exact recomputation can pick multinomial's token.
    vocab = 2048
    picks = set()
    for seed in range(30):
        noise = torch.empty(vocab).exponential_(1, generator=torch.Generator().manual_seed(seed))
        probs = noise / noise.sum()
        token, _ = _ours(probs, seed)
        expected, _ = _multinomial(probs, seed)
        assert token == expected, seed
        picks.add(token)
    assert len(picks) > 1  # the ties were settled by their last bits, not always to the first token


def test_a_nan_score_wins_as_in_the_argmax():
    probs = torch.full((300,), 1.0 / 300)
    probs[123] = float("nan")
    assert _ours(probs, 5)[0] == 123


def test_rows_drawn_on_threads_get_what_each_generator_draws_alone(two_threads, monkeypatch):
    rows = [_rows()["peaked"].roll(i * 7) for i in range(6)]
    alone = [_ours(probs, seed)[0] for seed, probs in enumerate(rows)]
    threads_used = set()
    draw = sampling_draws.draw
    monkeypatch.setattr(sampling_draws, "draw", lambda p, g: (threads_used.add(threading.get_ident()), draw(p, g))[1])
    side_by_side = sampling_draws.multinomial_draws(rows, [torch.Generator().manual_seed(s) for s in range(6)])
    assert threading.get_ident() not in threads_used  # the pool drew them, not the caller
    assert side_by_side == alone


def test_a_generator_serving_two_rows_draws_them_in_row_order(two_threads):
    probs = _rows()["flat"]
    shared = torch.Generator().manual_seed(3)
    first, second = sampling_draws.multinomial_draws([probs, probs], [shared, shared])
    again = torch.Generator().manual_seed(3)
    assert [first, second] == [int(torch.multinomial(probs, 1, generator=again)) for _ in range(2)]


def test_a_failing_row_returns_only_once_every_other_row_has_finished(two_threads, monkeypatch):
    finished = []
    draw = sampling_draws.draw

    def slow_or_failing(probs, generator):
        if probs[0] < 0:
            raise RuntimeError("this row fails at once")
        token = draw(probs, generator)
        threading.Event().wait(0.2)  # the other rows are still drawing when the failure is raised
        finished.append(token)
        return token

    monkeypatch.setattr(sampling_draws, "draw", slow_or_failing)
    bad = torch.full((64,), -1.0)
    good = [_rows()["flat"] for _ in range(3)]
    with pytest.raises(RuntimeError, match="fails at once"):
        sampling_draws.multinomial_draws([bad, *good], [torch.Generator().manual_seed(s) for s in range(4)])
    assert len(finished) == 3  # no row was still drawing when the caller got the failure
