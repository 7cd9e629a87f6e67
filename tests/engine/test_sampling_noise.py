"""The sampled rows' noise drawn side by side is the noise each row's generator draws alone."""

import threading

import pytest
import torch

from engine import sampling_noise


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _generators(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_rows_drawn_on_threads_get_the_numbers_each_generator_draws_alone(two_threads, monkeypatch):
    seeds = [7, 8, 9, 10, 11, 12]
    likes = [torch.zeros(4096) for _ in seeds]
    alone = [torch.empty(4096).exponential_(1, generator=g) for g in _generators(seeds)]
    threads_used = set()
    one = sampling_noise._one
    monkeypatch.setattr(sampling_noise, "_one", lambda like, g: (threads_used.add(threading.get_ident()), one(like, g))[1])
    side_by_side = sampling_noise.exponential_noise(likes, _generators(seeds))
    assert threading.get_ident() not in threads_used  # the pool drew them, not the caller
    for expected, got in zip(alone, side_by_side):
        assert torch.equal(expected, got)


def test_a_generator_serving_two_rows_draws_them_in_row_order(two_threads):
    shared = torch.Generator().manual_seed(3)
    first, second = sampling_noise.exponential_noise([torch.zeros(4096)] * 2, [shared, shared])
    again = torch.Generator().manual_seed(3)
    assert torch.equal(first, torch.empty(4096).exponential_(1, generator=again))
    assert torch.equal(second, torch.empty(4096).exponential_(1, generator=again))
