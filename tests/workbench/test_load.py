"""bench/load.py at a small size through the session's real Daphne (tests/workbench/conftest.py): four
clients, one user each, on both APIs, greedy and seeded, reading,
canceling, dropping their connections and reading slowly; every answer matches its solo run or is a prefix
of it, or is a structured refusal by that Daphne's low limits."""

from __future__ import annotations

import asyncio

import pytest

from bench.load import judge, load, solo, specs

pytestmark = pytest.mark.slow  # a real Daphne (shared by the session) and real clients

USERS = ["load0", "load1", "load2", "load3"]
SEED = 12  # with MAX_TOKENS, a plan with every behaviour: read, cancel and drop on both APIs, a slow reader
MAX_TOKENS = 12


def test_a_small_load_answers_everyone_with_their_own_tokens(limited_daphne):
    address, tokens = limited_daphne
    plan = specs(len(USERS), 2, USERS, SEED, MAX_TOKENS)
    results = asyncio.run(load(address, tokens, plan))
    report = judge(results, solo([spec for mine in plan for spec in mine]))
    assert report["requests"] == 8 and report["unanswered"] == 0, report
    assert report["mismatches"] == [] and report["offset_gaps"] == 0, report
    # Liveness: the oracle compared whole answers, not only prefixes.
    assert sum(r.ending == "done" for r in results) >= 2, report
    # This Daphne's low limits may refuse one whose predecessor's cancel has not reached the engine yet:
    # a structured answer too.
    assert set(report["endings"]) <= {"done", "canceled", "dropped", "error:overloaded", "error:rate_limited"}, report
