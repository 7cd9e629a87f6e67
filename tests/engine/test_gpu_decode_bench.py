"""bench/gpu_decode.py measures only modes that worked: on the CPU, with a tiny model, a mode whose
forward fails (Engine.step errors its sequences) or whose greedy tokens differ from eager's is reported
as failed with the reason, never as a speed. And it compares like with like: with a stand-in engine
whose tokens depend on the prefix cache's state, each mode's runs are checked against eager's runs in
the same state."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import Engine, EngineConfig, SamplingParams

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_decode.py"
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
PROMPTS = ["class Node:", [5, 6, 7]]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_decode", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def engine(tiny_checkpoint):
    return Engine(EngineConfig(model=str(tiny_checkpoint("llama", seed=5)), graphs=True, device_loop=True))


def no_sync():
    pass


def test_a_mode_that_decodes_like_eager_is_measured(bench, engine):
    eager = [list(r.token_ids) for r in engine.generate(PROMPTS, PARAMS)]
    seconds, failure, runs = bench.measure(engine, PROMPTS, PARAMS, 1, [eager, eager], sync=no_sync)
    assert failure is None and seconds > 0 and runs == [eager, eager]


def test_a_mode_whose_forward_fails_reports_why_instead_of_a_speed(bench, engine, monkeypatch):
    def broken(seqs, *chunking):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(engine.runner, "forward", broken)
    monkeypatch.setattr(engine.scheduler, "lookahead", lambda seqs: None)  # no burst: every token needs the forward
    seconds, failure, _ = bench.measure(engine, PROMPTS, PARAMS, 3, None, sync=no_sync)
    assert seconds is None and "finish_reason 'error'" in failure and "of 6 tokens" in failure


def test_a_mode_whose_greedy_tokens_differ_from_eagers_fails(bench, engine):
    eager = [list(r.token_ids) for r in engine.generate(PROMPTS, PARAMS)]
    eager[1][3] += 1
    seconds, failure, _ = bench.measure(engine, PROMPTS, PARAMS, 3, [eager] * 4, sync=no_sync)
    assert seconds is None and failure == "greedy tokens differ from eager's (sequence 1, first at token 3)"


class CacheStateEngine:
    """Stands in for a fresh Engine with prefix caching on: a prompt's first run (prefilled whole) gives
    other greedy tokens than its later runs (full blocks cached, the rest prefilled by the masked path),
    as one rounding's difference can on a GPU. `drift` changes a mode's cached-run tokens."""

    def __init__(self, flags, drift=0):
        self.seen: set[str] = set()
        self.drift = drift if flags.get("graphs") else 0
        self.runner = SimpleNamespace(graphs=SimpleNamespace(refusal=None))

    def generate(self, prompts, params):
        results = []
        for prompt in map(str, prompts):
            token = 2 + self.drift if prompt in self.seen else 1
            self.seen.add(prompt)
            results.append(SimpleNamespace(token_ids=[token] * params.max_tokens, finish_reason="length"))
        return results


MODES = {"eager": dict(graphs=False), "graphs": dict(graphs=True), "graphs+loop": dict(graphs=True, device_loop=True)}


def test_each_modes_runs_are_compared_with_eagers_in_the_same_cache_state(bench):
    reported = list(bench.compare_modes(CacheStateEngine, MODES, PROMPTS, PARAMS, 2, sync=no_sync))
    assert [(name, failure) for name, _, failure, _ in reported] == [(name, None) for name in MODES]
    assert all(seconds > 0 for _, seconds, _, _ in reported)


def test_a_mode_whose_cached_runs_differ_from_eagers_cached_runs_fails(bench):
    """The liveness control: the later runs are compared too, not only the fresh one."""
    reported = list(bench.compare_modes(lambda flags: CacheStateEngine(flags, drift=1), MODES, PROMPTS, PARAMS, 2,
                                        sync=no_sync))
    expected = "run 1: greedy tokens differ from eager's (sequence 0, first at token 0)"
    assert [(name, failure) for name, _, failure, _ in reported] == [("eager", None), ("graphs", expected),
                                                                  ("graphs+loop", expected)]


def test_a_probe_that_raises_leaves_the_speeds_standing(bench):
    answers = iter([12.5, RuntimeError("no CUPTI"), 7.0])

    def probe(engine):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    reported = list(bench.compare_modes(CacheStateEngine, MODES, PROMPTS, PARAMS, 1, sync=no_sync, probe=probe))
    assert [(name, failure, probed) for name, _, failure, probed in reported] == [
        ("eager", None, 12.5), ("graphs", None, "RuntimeError: no CUPTI"), ("graphs+loop", None, 7.0)]
    assert all(seconds > 0 for _, seconds, _, _ in reported)
