"""Which decode attention an engine takes: the Triton paged kernel on CUDA where triton imports and
ARC_TRITON_ATTENTION (EngineConfig.triton_attention) is on, the torch path everywhere else."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine import Engine, EngineConfig
from engine.model.attention import decode_attention_backend

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_the_cpu_takes_the_torch_path_whatever_the_flag():
    for allowed in (True, False):
        backend, why = decode_attention_backend(torch.device("cpu"), allowed)
        assert backend == "torch" and "CUDA only" in why


def test_cuda_takes_the_kernel_unless_the_flag_is_off():
    cuda = torch.device("cuda")  # only a name here: nothing runs on it
    assert decode_attention_backend(cuda, False) == ("torch", "ARC_TRITON_ATTENTION is off")
    backend, why = decode_attention_backend(cuda, True)
    assert backend == ("triton" if HAS_TRITON else "torch"), why


def test_the_flag_comes_from_the_environment_and_is_fixed_at_start(monkeypatch):
    monkeypatch.setenv("ARC_TRITON_ATTENTION", "0")
    assert EngineConfig.from_env().triton_attention is False
    monkeypatch.delenv("ARC_TRITON_ATTENTION")
    assert EngineConfig.from_env().triton_attention is True
    engine = Engine(EngineConfig(model="demo"))
    assert engine.loaded.model.decode_attention == "torch" and engine.flags()["ARC_TRITON_ATTENTION"] is False
    with pytest.raises(ValueError, match="ARC_TRITON_ATTENTION is fixed at start"):
        engine.set_flag("ARC_TRITON_ATTENTION", True)
