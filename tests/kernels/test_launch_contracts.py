"""The CuPy wrappers' launches, checked on the CPU: a recording launcher stands in for the GPU, runs a
line-for-line emulation of each kernel over the very tensors the wrapper passed, and the launch
contract (grid, block, argument dtypes, contiguity) is checked as it is before every real launch."""

from __future__ import annotations

import re

import numpy
import pytest
import torch

import engine.kernels.gpu.commit_token
import engine.kernels.gpu.fault_word
import engine.kernels.gpu.ring_argmax
from engine import Engine, EngineConfig, SamplingParams
from engine.kernels.gpu import cupy_support
from engine.kernels.gpu.commit_token import commit_token_cupy
from engine.kernels.gpu.cupy_support import KernelContractError
from engine.kernels.gpu.fault_word import fault_word_cupy, fault_word_ref
from engine.kernels.gpu.ring_argmax import ring_argmax_cupy, ring_argmax_ref
from tests.kernels.test_kernels import logits_with_ties


def emulate_ring_argmax(grid, block, logits, vocab, out):
    rows = logits.view(-1)[: grid * int(vocab)].view(grid, int(vocab))  # row r reads logits + r * vocab
    out.view(-1)[:grid] = rows.argmax(-1)  # thread blocks write out[blockIdx.x]


def emulate_commit_token(grid, block, sampled, input_ids, positions, rows):
    live = min(grid * block, int(rows))  # threads past `rows` do nothing
    input_ids.view(-1)[:live] = sampled.view(-1)[:live]
    positions.view(-1)[:live] += 1


def emulate_fault_word(grid, block, logits, n, fault):
    if not torch.isfinite(logits.view(-1)[: int(n)]).all():
        fault.view(-1)[0] |= 1


EMULATIONS = {"ring_argmax": emulate_ring_argmax, "commit_token": emulate_commit_token,
              "fault_word": emulate_fault_word}


@pytest.fixture
def launches(monkeypatch):
    """The recording launcher: every launch that passed its contract check, emulated on the CPU."""
    recorded = []

    def record(kernel, grid, block, args, device):
        recorded.append((kernel.name, grid, block, args))
        EMULATIONS[kernel.name](grid, block, *args)

    monkeypatch.setattr(cupy_support, "launcher", record)
    return recorded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ring_argmax_launches_one_block_per_row_and_writes_the_ring_in_place(launches, dtype):
    logits = logits_with_ties().to(dtype)
    ring, expected = torch.full((3, 8), -1, dtype=torch.long), torch.full((3, 8), -1, dtype=torch.long)
    ring_argmax_cupy(logits, ring, 1)
    ring_argmax_ref(logits.float(), expected, 1)
    [(name, grid, block, (scores, vocab, out))] = launches
    assert (name, grid, block) == ("ring_argmax", 5, engine.kernels.gpu.ring_argmax.THREADS)
    assert scores.dtype == torch.float32 and vocab == 50_000 and type(vocab) is numpy.int64
    assert out.data_ptr() == ring[1].data_ptr(), "the kernel must write the ring itself, not a copy"
    assert torch.equal(ring, expected)


def test_commit_token_covers_every_row_and_fault_word_reads_every_logit(launches):
    sampled = torch.arange(300)
    ids, positions = torch.zeros(300, dtype=torch.long), torch.arange(300)
    commit_token_cupy(sampled, ids, positions)
    assert torch.equal(ids, sampled) and torch.equal(positions, torch.arange(1, 301))
    logits, fault = torch.randn(4, 1000, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int32)
    logits[3, 999] = float("nan")
    fault_word_cupy(logits, fault)
    expected = torch.zeros(1, dtype=torch.int32)
    fault_word_ref(logits, expected)
    assert fault.item() == expected.item() == 1
    assert [(name, grid * block >= 300 if name == "commit_token" else True) for name, grid, block, _ in launches] \
        == [("commit_token", True), ("fault_word", True)]


def test_wrong_dtypes_layouts_and_scalars_are_refused_before_any_launch(launches):
    logits = torch.randn(2, 10)
    with pytest.raises(KernelContractError, match="out must be a torch.int64 tensor"):
        ring_argmax_cupy(logits, torch.zeros(2, 2, dtype=torch.int32), 0)
    with pytest.raises(KernelContractError, match="out must be contiguous"):
        ring_argmax_cupy(logits, torch.zeros(2, 4, dtype=torch.long).t(), 0)  # a ring row that is a column
    with pytest.raises(KernelContractError, match="input_ids must be contiguous"):
        commit_token_cupy(torch.arange(2), torch.zeros(2, 2, dtype=torch.long)[:, 0], torch.zeros(2, dtype=torch.long))
    with pytest.raises(KernelContractError, match="fault must be a torch.int32 tensor"):
        fault_word_cupy(logits, torch.zeros(1, dtype=torch.long))
    kernel = engine.kernels.gpu.fault_word.KERNEL
    with pytest.raises(KernelContractError, match="n must be a numpy.int64, got int"):
        kernel.launch(1, 32, (logits.view(-1), 20, torch.zeros(1, dtype=torch.int32)), logits.device)
    with pytest.raises(KernelContractError, match="block 128 but the kernel is written for 256"):
        engine.kernels.gpu.ring_argmax.KERNEL.launch(2, 128, (logits, numpy.int64(10), torch.zeros(2, dtype=torch.long)),
                                          logits.device)
    assert launches == [], "nothing that broke its contract was launched"


def test_each_signature_is_read_from_its_source_and_shared_arrays_match_the_block():
    for module in (engine.kernels.gpu.ring_argmax, engine.kernels.gpu.commit_token, engine.kernels.gpu.fault_word):
        kernel = module.KERNEL
        assert kernel.params and all(p.ctype in cupy_support.POINTEE_DTYPES for p in kernel.params)
        for size in re.findall(r"__shared__ [\w ]+\[(\d+)\]", kernel.source):
            assert int(size) == kernel.threads, f"{kernel.name}: shared arrays sized for another block"
    assert [(p.name, p.ctype, p.pointer) for p in engine.kernels.gpu.ring_argmax.KERNEL.params] == \
        [("logits", "float", True), ("vocab", "long long", False), ("out", "long long", True)]


def test_the_device_loop_through_the_cupy_wrappers_decodes_like_host_decode(launches, monkeypatch, tiny_checkpoint):
    checkpoint = tiny_checkpoint("llama", seed=3)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompts = ["class Node:", [5, 6, 7]]
    expected = [r.token_ids for r in Engine(EngineConfig(model=str(checkpoint), device_loop=False)).generate(prompts, params)]
    for module in (engine.kernels.gpu.ring_argmax, engine.kernels.gpu.commit_token, engine.kernels.gpu.fault_word):
        monkeypatch.setattr(module, "use_cupy", lambda *tensors: True)
    looped = Engine(EngineConfig(model=str(checkpoint), device_loop=True, graphs=True))
    got = [r.token_ids for r in looped.generate(prompts, params)]
    assert looped.device_loop.bursts > 0 and {name for name, *_ in launches} == set(EMULATIONS), \
        "liveness: bursts ran, through every wrapper"
    assert got == expected


class FakeCupy:
    """Just enough of CuPy to see where cupy_launch shares tensors and on which stream it launches."""

    def __init__(self, with_from_external: bool) -> None:
        self.events, self.current = [], "legacy"
        fake = self

        class Stream:
            def __init__(self, handle):
                self.handle = handle

            def __enter__(self):
                fake.current = self.handle

            def __exit__(self, *exc):
                fake.current = "legacy"

        if with_from_external:
            Stream.from_external = staticmethod(lambda obj: Stream(("from_external", obj.__cuda_stream__()[1])))
        self.cuda = type("cuda", (), {"Stream": Stream,
                                      "ExternalStream": lambda handle, device: Stream(("ExternalStream", handle))})

    def from_dlpack(self, tensor):
        self.events.append(("from_dlpack", self.current))
        return tensor

    def RawKernel(self, source, name):
        return lambda grid, block, args: self.events.append(("launch", self.current))


@pytest.mark.parametrize("with_from_external", [True, False], ids=["cupy-14", "cupy-13"])
def test_tensors_are_shared_and_launched_on_torchs_stream(monkeypatch, with_from_external):
    fake = FakeCupy(with_from_external)
    monkeypatch.setattr(cupy_support, "cupy_module", lambda: fake)
    monkeypatch.setattr(cupy_support, "_compiled", lambda kernel: fake.RawKernel(kernel.source, kernel.name))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: type("S", (), {"cuda_stream": 77})())
    fault = torch.zeros(1, dtype=torch.int32)
    cupy_support.cupy_launch(engine.kernels.gpu.fault_word.KERNEL, 1, 32, (torch.zeros(4), numpy.int64(4), fault),
                             torch.device("cuda", 0))
    stream = ("from_external" if with_from_external else "ExternalStream", 77)
    # DLPack hand-over outside torch's stream would order against the legacy stream (a capture breaker).
    assert fake.events == [("from_dlpack", stream), ("from_dlpack", stream), ("launch", stream)]
