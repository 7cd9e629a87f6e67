"""A user's share of the input thread (workbench/serving/input_share.py), on a clock of the test's own:
the seconds of reading counted over a 10 s window, the refusal once the share is spent and when it says
to come back, the queue of waiting requests, and each user counted apart."""

from __future__ import annotations

import pytest

from workbench.serving import input_share
from workbench.serving.limits import Refused


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def shares(settings, monkeypatch):
    settings.WORKBENCH_USER_INPUT_SHARE = 0.25  # 2.5 s of reading in 10 s
    settings.WORKBENCH_USER_INPUT_QUEUE = 2
    clock = Clock()
    monkeypatch.setattr(input_share.time, "monotonic", clock)
    return input_share.InputShares(), clock


def read(shares: input_share.InputShares, user: str, seconds: float) -> None:
    shares.take_turn(user)
    shares.spent(user, seconds)
    shares.leave(user)


def test_the_share_spent_refuses_until_enough_of_it_leaves_the_window(shares):
    counts, clock = shares
    read(counts, "flood", 1.0)
    clock.now += 1
    read(counts, "flood", 1.4)  # 2.4 s: under the share, still read
    clock.now += 1
    read(counts, "flood", 0.5)  # 2.9 s spent
    with pytest.raises(Refused) as refused:
        counts.take_turn("flood")
    assert refused.value.code == "rate_limited" and "2.9 s" in refused.value.message
    # Under 2.5 s once the first second leaves the window, 10 s after it was counted (8 s from now).
    assert refused.value.retry_after == 8
    read(counts, "quiet", 0.1)  # another user's share is their own
    clock.now += 7.9
    with pytest.raises(Refused):
        counts.take_turn("flood")
    clock.now += 0.2
    counts.take_turn("flood")


def test_a_user_may_have_only_the_queue_limit_of_requests_waiting(shares):
    counts, _ = shares
    counts.take_turn("burst")
    counts.take_turn("burst")
    with pytest.raises(Refused) as refused:
        counts.take_turn("burst")
    assert "WORKBENCH_USER_INPUT_QUEUE" in refused.value.message
    counts.take_turn("other")
    counts.leave("burst")
    counts.take_turn("burst")


def test_zero_turns_each_limit_off(shares, settings):
    counts, _ = shares
    settings.WORKBENCH_USER_INPUT_SHARE = 0
    settings.WORKBENCH_USER_INPUT_QUEUE = 0
    for _ in range(5):
        counts.take_turn("anyone")
        counts.spent("anyone", 10.0)
