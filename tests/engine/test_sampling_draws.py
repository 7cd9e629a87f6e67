"""The CPU's sampled rows draw exactly what torch.multinomial draws, and leave the generator where it does:
both ways, the native op (engine/kernels/cpu/sampling_draws.cpp) and the numpy path that runs without it."""

import threading

import pytest
import torch

from engine import sampling_draws

# The native tests ask for the kernels through the fixture, never at import: collecting builds nothing.
needs_native = pytest.mark.usefixtures("native_cpu_kernels")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _native_draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return torch.ops.workbench.multinomial_draws([probs], [generator])[0]


@pytest.fixture(params=["numpy", "native"])
def way(request):
    """One row's draw, each way: the numpy path, and the native op (where the kernels build)."""
    if request.param == "numpy":
        return sampling_draws.draw
    request.getfixturevalue("native_cpu_kernels")
    return _native_draw


def _generator(seed: int) -> torch.Generator:
    """Seeded, then moved a seed-dependent way into its mt19937 block, so draws start anywhere in one."""
    generator = torch.Generator().manual_seed(seed)
    torch.empty(seed * 37 % 701, dtype=torch.int32).random_(generator=generator)
    return generator


def _multinomial(probs: torch.Tensor, seed: int) -> tuple[int, torch.Tensor]:
    generator = _generator(seed)
    return int(torch.multinomial(probs, 1, generator=generator)), generator.get_state()


def _ours(draw, probs: torch.Tensor, seed: int) -> tuple[int, torch.Tensor]:
    generator = _generator(seed)
    return draw(probs, generator), generator.get_state()


def _rows() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    vocab = 4099
    peaked = torch.softmax(torch.randn(vocab) * 4, dim=-1)
    top_k = torch.softmax(torch.randn(vocab), dim=-1)
    top_k[torch.randperm(vocab)[:vocab - 40]] = 0.0
    return {"peaked": peaked, "flat": torch.full((vocab,), 1.0 / vocab), "top-k": top_k,
            "one token": torch.nn.functional.one_hot(torch.tensor(17), vocab).float()}


@pytest.mark.parametrize("kind", list(_rows()))
def test_each_row_draws_multinomials_token_and_leaves_its_generator_as_multinomial_does(kind, way):
    probs = _rows()[kind]
    for seed in range(40):
        token, state = _ours(way, probs, seed)
        expected, expected_state = _multinomial(probs, seed)
        assert token == expected, (kind, seed)
        assert torch.equal(state, expected_state), (kind, seed)


def test_scores_tied_to_the_last_bits_are_settled_as_the_exact_argmax_settles_them(way):
    # Probabilities proportional to the very noise the seed will draw: every score is the same number up
    # to rounding, so many are candidates and only the exact recomputation can pick multinomial's token.
    vocab = 2048
    picks = set()
    for seed in range(30):
        noise = torch.empty(vocab).exponential_(1, generator=_generator(seed))
        probs = noise / noise.sum()
        token, _ = _ours(way, probs, seed)
        expected, _ = _multinomial(probs, seed)
        assert token == expected, seed
        picks.add(token)
    assert len(picks) > 1  # the ties were settled by their last bits, not always to the first token


def test_a_nan_score_wins_as_in_the_argmax(way):
    probs = torch.full((300,), 1.0 / 300)
    probs[123] = float("nan")
    assert _ours(way, probs, 5)[0] == 123


def test_rows_without_a_positive_probability_draw_as_multinomials_argmax_does(way):
    # Not a distribution (the sampler then draws again in float64), but the draw must still be torch's.
    for probs in (torch.zeros(500), -torch.rand(500), torch.tensor([0.0, float("inf"), 1.0, float("inf")])):
        for seed in range(5):
            noise = torch.empty(probs.shape).exponential_(1, generator=_generator(seed))
            expected = int((probs / noise).argmax())
            assert _ours(way, probs, seed)[0] == expected


@needs_native
def test_the_native_op_draws_rows_side_by_side_as_each_generator_draws_alone(two_threads):
    rows = [_rows()["peaked"].roll(i * 7) for i in range(6)]
    alone = [_ours(sampling_draws.draw, probs, seed) for seed, probs in enumerate(rows)]
    generators = [_generator(seed) for seed in range(6)]
    side_by_side = sampling_draws.multinomial_draws(rows, generators)
    assert side_by_side == [token for token, _ in alone]
    assert all(torch.equal(g.get_state(), state) for g, (_, state) in zip(generators, alone))


@needs_native
def test_the_native_op_draws_a_shared_generators_rows_in_row_order(two_threads):
    probs = _rows()["flat"]
    shared, again = _generator(3), _generator(3)
    drawn = torch.ops.workbench.multinomial_draws([probs, probs, probs], [shared, _generator(4), shared])
    assert [drawn[0], drawn[2]] == [int(torch.multinomial(probs, 1, generator=again)) for _ in range(2)]


@needs_native
def test_the_native_op_refuses_a_row_it_cannot_read_before_any_generator_moves():
    generators = [_generator(1), _generator(2)]
    before = [g.get_state() for g in generators]
    with pytest.raises(ValueError, match="float32"):
        torch.ops.workbench.multinomial_draws([_rows()["flat"], torch.ones(5, dtype=torch.float64)], generators)
    assert all(torch.equal(g.get_state(), state) for g, state in zip(generators, before))


def test_the_numpy_path_draws_rows_on_its_pool_as_each_generator_draws_alone(two_threads, monkeypatch):
    rows = [_rows()["peaked"].roll(i * 7) for i in range(6)]
    alone = [_ours(sampling_draws.draw, probs, seed)[0] for seed, probs in enumerate(rows)]
    threads_used = set()
    draw = sampling_draws.draw
    monkeypatch.setattr(sampling_draws, "draw", lambda p, g: (threads_used.add(threading.get_ident()), draw(p, g))[1])
    side_by_side = sampling_draws.numpy_draws(rows, [_generator(s) for s in range(6)])
    assert threading.get_ident() not in threads_used  # the pool drew them, not the caller
    assert side_by_side == alone


def test_the_numpy_path_draws_a_shared_generators_rows_in_row_order(two_threads):
    probs = _rows()["flat"]
    shared, again = _generator(3), _generator(3)
    first, second = sampling_draws.numpy_draws([probs, probs], [shared, shared])
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
        sampling_draws.numpy_draws([bad, *good], [_generator(s) for s in range(4)])
    assert len(finished) == 3  # no row was still drawing when the caller got the failure
