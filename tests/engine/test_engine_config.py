"""EngineConfig reads no environment; EngineConfig.from_env reads every start-time ARC_* flag the
registry names, and what the caller passes wins over it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import EngineConfig
from engine.engine_config import CPU_PREFILL_BESIDE_DECODES, DEFAULT_TOKEN_BUDGET
from engine.host.capabilities import REGISTRY
from engine.model.config import ModelConfig

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
            "prefix_caching", "triton_attention", "invariant_gemm", "replay_audit_permille"} == \
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


def test_graphs_and_the_capture_stream_default_on_on_cuda_and_off_elsewhere(monkeypatch):
    assert (EngineConfig().graphs_on, EngineConfig().capture_stream_on) == (False, False)
    assert EngineConfig(graphs=True, capture_stream=True).graphs_on
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only so a CUDA config can be built here
    assert (EngineConfig(device="cuda").graphs_on, EngineConfig(device="cuda").capture_stream_on) == (True, True)
    assert not EngineConfig(device="cuda", graphs=False).graphs_on
    assert not EngineConfig(device="cuda", capture_stream=False).capture_stream_on


def test_quantized_weights_on_cuda_are_taken_in_bfloat16_and_refused_in_another_dtype(monkeypatch):
    """torch's CUDA int4 kernel takes bfloat16 activations only (engine/kernels/gpu/cuda_int4.py)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # only so a CUDA config can be built here
    config = EngineConfig(device="cuda", dtype="bfloat16", weights="quantized")
    assert config.weight_format == "quantized"
    for dtype in ("float32", "float16"):
        with pytest.raises(ValueError, match=f"on CUDA needs dtype='bfloat16'.*got dtype='{dtype}'"):
            EngineConfig(device="cuda", dtype=dtype, weights="quantized")
    assert EngineConfig(device="cuda", dtype="float32", weights="dequantized").weight_format == "dequantized"
    assert EngineConfig(device="cpu", dtype="float32", weights="quantized").weight_format == "quantized"


def test_the_kv_pool_takes_its_fraction_of_free_gpu_memory_or_what_is_set():
    """SmolLM2-135M's shape in bfloat16: 30 layers x 3 KV heads x 64 dims x 2 bytes, keys and values, so
    a block of 16 tokens is 368,640 bytes. With 100 GiB free and the default fraction 0.8, the pool is
    80 GiB: 233,016 blocks (3.7M tokens). A CPU pool, or a set size, ignores the free figure."""
    model = ModelConfig(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                        max_position_embeddings=8192)
    free = 100 * 2**30
    per_block = 2 * 30 * 16 * 3 * 64 * 2
    gpu = EngineConfig(dtype="bfloat16")
    assert gpu.kv_pool_bytes(free) == int(0.8 * free)
    assert gpu.kv_blocks_for(model, 8192, free) == int(0.8 * free) // per_block == 233_016
    assert EngineConfig(dtype="bfloat16", kv_memory_fraction=0.5).kv_blocks_for(model, 8192, free) == 145_635
    assert gpu.kv_blocks_for(model, 8192) == 2048 * 2**20 // per_block, "no free figure: the CPU default"
    assert EngineConfig(dtype="bfloat16", kv_cache_mb=1024).kv_blocks_for(model, 8192, free) == 1024 * 2**20 // per_block
    tiny = EngineConfig(dtype="bfloat16", kv_memory_fraction=0.01).kv_blocks_for(model, 8192, 2**20)
    assert tiny == 8192 // 16, "never less than one full-length sequence"
    for fraction in (0, 1, 1.5):
        with pytest.raises(ValueError, match="kv_memory_fraction"):
            EngineConfig(kv_memory_fraction=fraction)
    with pytest.raises(ValueError, match="kv_cache_mb"):
        EngineConfig(kv_cache_mb=0)
