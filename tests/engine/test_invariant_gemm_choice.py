"""Which GEMM an engine's float projections take: the batch-invariant Triton kernel on CUDA where triton
imports and ARC_INVARIANT_GEMM (EngineConfig.invariant_gemm) is on; the CPU's own kernels or F.linear
everywhere else. And that the choice reaches every projection, the fused ones and the head included."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from engine import Engine, EngineConfig
from engine.kernels import gpu as gpu_kernels
from engine.model import layers
from engine.model.layers import FusedFloatLinear, Linear, invariant_gemm_choice

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_the_cpu_keeps_its_own_kernels_whatever_the_flag():
    for allowed in (True, False):
        invariant, why = invariant_gemm_choice(torch.device("cpu"), allowed)
        assert invariant is False and "for CUDA" in why


def test_cuda_takes_the_kernel_unless_the_flag_is_off():
    cuda = torch.device("cuda")  # only a name here: nothing runs on it
    assert invariant_gemm_choice(cuda, False) == (False, "ARC_INVARIANT_GEMM is off")
    invariant, why = invariant_gemm_choice(cuda, True)
    assert invariant is HAS_TRITON, why


def test_the_flag_comes_from_the_environment_and_is_fixed_at_start(monkeypatch):
    monkeypatch.setenv("ARC_INVARIANT_GEMM", "0")
    assert EngineConfig.from_env().invariant_gemm is False
    monkeypatch.delenv("ARC_INVARIANT_GEMM")
    assert EngineConfig.from_env().invariant_gemm is True
    engine = Engine(EngineConfig(model="demo"))
    assert engine.loaded.model.invariant_gemm is False and engine.flags()["ARC_INVARIANT_GEMM"] is False
    with pytest.raises(ValueError, match="ARC_INVARIANT_GEMM is fixed at start"):
        engine.set_flag("ARC_INVARIANT_GEMM", True)


def test_the_choice_reaches_every_projection_and_float_linear_takes_the_kernel_on_cuda_only(monkeypatch):
    """set_invariant_gemm marks every Linear and every fused projection (a plain attribute of its module,
    which a walk over submodules alone would miss); float_linear then calls the kernel for CUDA rows and
    never for CPU ones. The kernel is replaced by a recorder: no CUDA here to run it."""
    model = Engine(EngineConfig(model="demo")).loaded.model
    model.set_invariant_gemm(True)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    fused = [v for m in model.modules() for v in vars(m).values() if isinstance(v, FusedFloatLinear)]
    assert len(fused) == 2 * model.config.num_hidden_layers, "liveness: q/k/v and gate/up fused in every layer"
    assert model.lm_head in linears and all(p.invariant_gemm for p in linears + fused)

    class CudaRows(torch.Tensor):  # CPU rows that say they are on CUDA
        is_cuda = True

    calls = []
    fake = type("Kernel", (), {"invariant_linear": staticmethod(lambda x, w, b: calls.append(x.shape) or x)})
    monkeypatch.setitem(sys.modules, "engine.kernels.gpu.triton_linear", fake)
    monkeypatch.setattr(gpu_kernels, "triton_linear", fake, raising=False)
    monkeypatch.setattr(layers.cpu_kernels, "native_available", lambda: False)
    with torch.no_grad():
        rows = torch.zeros(3, model.config.hidden_size)
        fused[0](rows)
        assert calls == []  # CPU rows: F.linear
        fused[0](rows.as_subclass(CudaRows))
        model.lm_head(rows.as_subclass(CudaRows))
    assert calls == [(3, model.config.hidden_size)] * 2
    model.set_invariant_gemm(False)
    assert not any(p.invariant_gemm for p in linears + fused) and model.invariant_gemm is False
