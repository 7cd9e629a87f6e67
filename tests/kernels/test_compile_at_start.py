"""The CuPy kernels compile when an engine starts on a CUDA device, and a CuPy that cannot load NVRTC
stops the start with one error naming the package to install (engine/kernels/gpu/cupy_support.py).

This machine has no GPU and no CuPy: a stand-in CuPy records what is compiled and, where a test says
so, fails as CuPy fails without NVRTC ("CuPy failed to load libnvrtc.so.13: OSError: ..."). On the
GPU machine the engine tests start real engines on CUDA, which compile the real kernels.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from engine import Engine, EngineConfig
from engine import engine as engine_module
from engine.kernels.gpu import cupy_support
from engine.kernels.gpu.cupy_support import KERNELS, NvrtcMissingError, compile_for

NO_NVRTC = "CuPy failed to load libnvrtc.so.13: OSError: libnvrtc.so.13: cannot open shared object file"


class CompileException(Exception):
    """Named as CuPy's: the error NVRTC gives for a source it refuses."""


def stand_in_cupy(compiled: list[tuple[int, str]], failure: Exception | None = None) -> SimpleNamespace:
    current = [0]

    @contextlib.contextmanager
    def device(index: int):
        current[0] = index
        yield

    class RawKernel:
        def __init__(self, source: str, name: str) -> None:
            self.name = name

        def compile(self) -> None:
            if failure is not None:
                raise failure
            compiled.append((current[0], self.name))

    return SimpleNamespace(__version__="14.2.0", RawKernel=RawKernel, cuda=SimpleNamespace(Device=device))


@pytest.fixture
def cupy(monkeypatch):
    """Installs a stand-in CuPy (built by the test) and leaves no kernel of it in the compile cache."""
    cupy_support._compiled.cache_clear()

    def install(failure: Exception | None = None) -> list[tuple[int, str]]:
        compiled: list[tuple[int, str]] = []
        module = stand_in_cupy(compiled, failure)
        monkeypatch.setattr(cupy_support, "cupy_module", lambda: module)
        return compiled

    yield install
    cupy_support._compiled.cache_clear()


def test_every_kernel_compiles_for_the_engines_cuda_device(cupy):
    compiled = cupy()
    assert {"ring_argmax", "commit_token", "fault_word"} <= {k.name for k in KERNELS}, "liveness: kernels registered"
    assert compile_for(torch.device("cuda", 1)) == len(KERNELS)
    assert sorted(compiled) == sorted((1, k.name) for k in KERNELS)


def test_nothing_compiles_on_a_cpu(cupy):
    compiled = cupy(failure=RuntimeError(NO_NVRTC))
    assert compile_for(torch.device("cpu")) == 0 and compiled == []


@pytest.mark.parametrize("torch_cuda, package", [("13.0", "cupy-cuda13x[ctk]"), ("12.8", "cupy-cuda12x[ctk]")])
def test_a_missing_nvrtc_is_one_error_naming_the_package(cupy, monkeypatch, torch_cuda, package):
    cupy(failure=RuntimeError(NO_NVRTC))
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    with pytest.raises(NvrtcMissingError) as caught:
        compile_for(torch.device("cuda", 0))
    message = str(caught.value)
    assert f'install "{package}"' in message and "libnvrtc.so.13" in message and "CuPy 14.2.0" in message
    assert f"CUDA {torch_cuda}" in message


def test_a_source_nvrtc_refuses_keeps_cupys_own_error(cupy):
    cupy(failure=CompileException("ring_argmax.cu(3): error: identifier \"INFINITY\" is undefined (NVRTC)"))
    with pytest.raises(CompileException):
        compile_for(torch.device("cuda", 0))


def test_the_engine_compiles_when_it_starts_and_stops_on_the_error(monkeypatch):
    devices: list[torch.device] = []

    def recording(device: torch.device) -> int:
        devices.append(device)
        return compile_for(device)

    monkeypatch.setattr(engine_module, "compile_for", recording)
    engine = Engine(EngineConfig(model="demo", device_loop=False, graphs=False))
    assert devices == [engine.loaded.device], "compile_for runs once, at start, for the engine's device"

    def no_nvrtc(device: torch.device) -> int:
        raise NvrtcMissingError("no NVRTC")

    monkeypatch.setattr(engine_module, "compile_for", no_nvrtc)
    with pytest.raises(NvrtcMissingError):
        Engine(EngineConfig(model="demo", device_loop=False, graphs=False))
