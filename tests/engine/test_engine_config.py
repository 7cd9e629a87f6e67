"""EngineConfig reads no environment; EngineConfig.from_env reads every start-time ARC_* flag the
registry names, and what the caller passes wins over it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from engine import EngineConfig
from engine.engine_config import CPU_PREFILL_BESIDE_DECODES, DEFAULT_TOKEN_BUDGET
from engine.host.capabilities import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
START_FLAGS = [entry for entry in REGISTRY if entry.config_field]
# A value for each flag that differs from its default: the other one for a bool, 3 for an int.
SET = {entry.name: (("0", False) if entry.default else ("1", True)) if entry.kind == "bool" else ("3", 3)
       for entry in START_FLAGS}


@pytest.fixture
def every_flag_set(monkeypatch) -> None:
    for name, (raw, _) in SET.items():
        monkeypatch.setenv(name, raw)


def test_the_registry_names_config_fields_whose_defaults_are_its_own():
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    assert {"device_loop", "graphs", "capture_stream", "verify_replays", "verify_always", "layer_bisect",
            "prefix_caching"} == \
        {entry.config_field for entry in START_FLAGS}, "liveness: the flags read at start"
    for entry in START_FLAGS:
        assert entry.config_field in fields, f"{entry.name}: EngineConfig has no field {entry.config_field}"
        assert fields[entry.config_field].default == entry.default, entry.name


@pytest.mark.usefixtures("every_flag_set")
def test_the_python_api_ignores_the_environment():
    config = EngineConfig(model="demo")
    assert {e.name: getattr(config, e.config_field) for e in START_FLAGS} == {e.name: e.default for e in START_FLAGS}


@pytest.mark.usefixtures("every_flag_set")
def test_from_env_reads_every_start_flag():
    config = EngineConfig.from_env(model="demo", burst_length=4)
    assert {e.name: getattr(config, e.config_field) for e in START_FLAGS} == {n: v for n, (_, v) in SET.items()}
    assert (config.model, config.burst_length) == ("demo", 4), "the other fields as given"


@pytest.mark.usefixtures("every_flag_set")
def test_what_the_caller_passes_wins_over_the_environment():
    config = EngineConfig.from_env(device_loop=False, verify_replays=0)
    assert (config.device_loop, config.verify_replays, config.graphs) == (False, 0, True)


def test_from_env_with_nothing_set_is_the_plain_config(monkeypatch):
    for entry in START_FLAGS:
        monkeypatch.delenv(entry.name, raising=False)
    assert EngineConfig.from_env(model="demo") == EngineConfig(model="demo")


def test_from_env_refuses_a_malformed_flag_and_checks_fields_as_the_constructor(monkeypatch):
    monkeypatch.setenv("ARC_GRAPH_VERIFY_REPLAYS", "often")
    with pytest.raises(ValueError, match="ARC_GRAPH_VERIFY_REPLAYS must be an integer"):
        EngineConfig.from_env()
    monkeypatch.delenv("ARC_GRAPH_VERIFY_REPLAYS")
    with pytest.raises(ValueError, match="burst_length must be >= 1"):
        EngineConfig.from_env(burst_length=0)


def test_the_command_line_takes_the_flags_from_the_environment(tmp_path):
    """`python -m engine generate` builds its engine with from_env: a malformed flag stops it by name,
    which EngineConfig(...) alone would never notice."""
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", "demo", "--prompt", "a",
                             "--max-tokens", "1"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
                                 "ARC_GRAPH_VERIFY_REPLAYS": "often"})
    assert result.returncode != 0 and "ARC_GRAPH_VERIFY_REPLAYS must be an integer" in result.stderr


@pytest.mark.parametrize("budget", [0, -5, "512", 2.5, True])
@pytest.mark.parametrize("name", ["max_num_batched_tokens", "max_prefill_beside_decodes"])
def test_a_bad_step_token_budget_is_refused_by_name(name, budget):
    with pytest.raises(ValueError, match=f"{name} must be"):
        EngineConfig(**{name: budget})


def test_the_step_token_budgets_default_by_device_and_a_given_one_wins():
    assert EngineConfig().token_budget == DEFAULT_TOKEN_BUDGET
    assert EngineConfig(max_num_batched_tokens=96).token_budget == 96
    assert EngineConfig().prefill_budget_beside_decodes == CPU_PREFILL_BESIDE_DECODES < DEFAULT_TOKEN_BUDGET
    assert EngineConfig(max_prefill_beside_decodes=96).prefill_budget_beside_decodes == 96
