"""bench/gpu_decode.py measures only modes that worked: on the CPU, with a tiny model, a mode whose
forward fails (Engine.step errors its sequences) or whose greedy tokens differ from eager's is reported
as failed with the reason, never as a speed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    seconds, failure, tokens = bench.measure(engine, PROMPTS, PARAMS, 1, eager, sync=no_sync)
    assert failure is None and seconds > 0 and tokens == eager


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
    seconds, failure, _ = bench.measure(engine, PROMPTS, PARAMS, 3, eager, sync=no_sync)
    assert seconds is None and failure == "greedy tokens differ from eager's (sequence 1, first at token 3)"
