"""The load oracle's near-tie forgiveness (bench/load_oracle.py): a served answer that differs from its solo
run is forgiven only where its first differing token is a near-tie the solo run logged, with the logged
rival, on a greedy request; every other difference stays a mismatch. No server: results are built here."""

from __future__ import annotations

import pytest

from bench.load_clients import Result, Spec
from bench.load_oracle import Solo, judge, solo
from engine import Engine, EngineConfig

GREEDY = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
SEEDED = {"max_tokens": 4, "temperature": 0.8, "seed": 7, "ignore_eos": True}
# Token 2 is the solo run's choice at position 2, with token 9 logged 0.0004 nats behind it.
WANT = Solo([1, 2, 3, 4], "a b c d", [0, 1, 3, 5], ties={2: {9: 0.0004}}, rival_texts={9: " x"})


def result(api: str, ending: str, tokens: list[int] = (), text: str = "", params: dict = GREEDY) -> Result:
    return Result(Spec(0, api, "u", "p", params, "read", 1), ending=ending, text=text, token_ids=list(tokens))


def verdict(r: Result) -> tuple[list, list]:
    report = judge([r], {0: WANT})
    return report["mismatches"], [f["position"] for f in report["forgiven_near_ties"]]


@pytest.mark.parametrize("served, expected", [
    ([1, 2, 3, 4], ([], [])),          # equal
    ([1, 2, 9, 7], ([], [2])),         # first differs at the logged tie, with the logged rival: forgiven
    ([1, 2, 8, 7], ([0], [])),         # at the tie but not the logged rival
    ([1, 5, 9, 7], ([0], [])),         # first differs where nothing was logged (a tie later does not help)
    ([1, 2, 3], ([0], [])),            # ends early: no differing token, a mismatch
    ([1, 2, 3, 4, 5], ([0], [])),      # runs long
])
def test_a_completed_websocket_answer_is_forgiven_only_at_a_logged_near_tie(served, expected):
    assert verdict(result("ws", "done", served)) == expected


def test_a_cut_answer_is_judged_as_a_prefix_with_the_same_forgiveness():
    assert verdict(result("ws", "canceled", [1, 2])) == ([], [])
    assert verdict(result("ws", "dropped", [1, 2, 9])) == ([], [2])
    assert verdict(result("ws", "canceled", [1, 7])) == ([0], [])


def test_a_seeded_answer_is_never_forgiven():
    # A draw is not in the logprobs: a near-tie cannot be shown for it.
    assert verdict(result("ws", "done", [1, 2, 9, 7], params=SEEDED)) == ([0], [])


def test_an_openai_answer_is_forgiven_by_the_rival_text_at_the_tied_token():
    assert verdict(result("openai", "done", text="a b x z")) == ([], [2])  # " x" where " c" was
    assert verdict(result("openai", "done", text="a b y z")) == ([0], [])  # not the rival's text
    assert verdict(result("openai", "done", text="a q c d")) == ([0], [])  # differs at token 1: no tie there
    assert verdict(result("openai", "done", text="a b c d")) == ([], [])


@pytest.mark.slow  # loads the demo model
def test_the_solo_run_logs_near_ties_of_greedy_requests_only_within_eps():
    engine = Engine(EngineConfig(model="demo"))
    greedy = Spec(0, "ws", "u", "The list type", {**GREEDY, "max_tokens": 6}, "read", 1)
    seeded = Spec(1, "ws", "u", "The list type", {**SEEDED, "max_tokens": 6}, "read", 1)
    wide = solo([greedy, seeded], eps=float("inf"), engine=engine)
    # Liveness: with no bound every position of the greedy run has rivals, each with its gap and text.
    assert sorted(wide[0].ties) == list(range(6)) and all(g >= 0 for t in wide[0].ties.values() for g in t.values())
    assert set(wide[0].rival_texts) == {r for t in wide[0].ties.values() for r in t}
    assert wide[1].ties == {}
    assert solo([greedy], eps=0.0, engine=engine)[0].ties == {}
    # Offsets: where each token's text starts in the answer's text.
    answer = wide[0]
    assert answer.offsets[0] == 0 and answer.offsets == sorted(answer.offsets)
    assert answer.text.startswith(engine.tokenizer.decode(answer.token_ids[:3]))
