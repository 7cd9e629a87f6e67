"""What a captured decode step may do, proven without a GPU.

- On torch's meta device (tensors with shapes and dtypes but no data) the step a graph would capture
  runs with the model, the KV cache and the static buffers: no `.item()`, `.tolist()`, `nonzero` or
  host tensor in it, each of which breaks (or silently bakes a value into) a CUDA graph capture.
- A device-loop burst step builds nothing from host values: what is constant within a burst (the
  graph key and the block tables) is built once per burst.
- Graphs are keyed by block count as well as batch size, so a short batch never attends over the whole
  length limit's blocks.
- CUDA capture (through a stand-in for torch.cuda): one memory pool for every graph, largest first
  when captured ahead, every graph the config can replay captured at the engine's start (none while
  serving), and a failed capture restores the caller's stream and names its first error.
- The CPU replay backend matches eager exactly in bf16, the benchmark's dtype.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from engine import Engine, EngineConfig, SamplingParams
from engine.decode.graphs import DecodeGraphs, GraphMode
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.scheduler.kv_cache import KVShape, PagedKVCache
from engine.kernels.gpu.commit_token import commit_token
from engine.kernels.gpu.fault_word import fault_word
from engine.kernels.gpu.ring_argmax import ring_argmax
from tests.conftest import TINY_BASE

GREEDY = dict(temperature=0, ignore_eos=True)
HOST_VALUES = {torch.tensor, torch.as_tensor, torch.from_numpy, torch.nonzero, torch.Tensor.nonzero,
               torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
               torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__index__}


class HostValueGuard(TorchFunctionMode):
    """Records every call that reads a device value on the host or builds a tensor from host values."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_VALUES:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


class MetaOnly(TorchDispatchMode):
    """Fails any operation that touches a tensor off the meta device (a host tensor in the step)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for value in tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                raise AssertionError(f"{func} touched a {value.device} tensor inside the captured step")
        return func(*args, **(kwargs or {}))


def meta_graphs() -> DecodeGraphs:
    config = ModelConfig.from_hf_dict(dict(model_type="llama", **TINY_BASE))
    meta = torch.device("meta")
    with meta:
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.fuse_for_inference()
    cache = PagedKVCache(KVShape.of(config), num_blocks=64, block_size=16, dtype=torch.bfloat16, device=meta)
    return DecodeGraphs(model, cache, max_blocks=16, dtype=torch.bfloat16, device=meta, capture_stream=False)


def burst_steps(graphs: DecodeGraphs, steps: int) -> None:
    """A device-loop burst's steps as the loop runs them: replay, fault word, argmax, commit."""
    batch = graphs.prepare([[0, 1], [2], [3, 4, 5]])
    meta = graphs.device
    ids, positions = torch.zeros(8, dtype=torch.long, device=meta), torch.zeros(8, dtype=torch.long, device=meta)
    ring, fault = torch.zeros(steps, 8, dtype=torch.long, device=meta), torch.zeros(1, dtype=torch.int32, device=meta)
    graphs.replay(batch, ids[:3], positions[:3])  # the warm-up a capture does first (caches RoPE on the device)
    guard = HostValueGuard()
    with guard, MetaOnly():
        for step in range(steps):
            logits = graphs.replay(batch, ids[:3], positions[:3])
            fault_word(logits, fault)
            ring_argmax(logits, ring, step)
            commit_token(ring[step, :3], ids[:3], positions[:3])
    assert guard.calls == [], f"host values inside the captured step: {guard.calls}"
    assert logits.shape == (3, TINY_BASE["vocab_size"]) and logits.device.type == "meta"


def test_the_captured_decode_step_runs_on_the_meta_device():
    burst_steps(meta_graphs(), steps=2)


def test_the_meta_check_catches_a_host_read_in_the_step(monkeypatch):
    """Liveness control: a step that reads a position on the host fails the check above."""
    graphs = meta_graphs()
    real_forward = graphs._forward
    monkeypatch.setattr(graphs, "_forward", lambda ids, pos, tables: (pos.tolist(), real_forward(ids, pos, tables))[1])
    with pytest.raises((AssertionError, RuntimeError, NotImplementedError)):
        burst_steps(graphs, steps=1)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_burst_steps_build_nothing_from_host_values(checkpoint, monkeypatch, graphs):
    engine = Engine(EngineConfig(model=str(checkpoint), device_loop=True, graphs=graphs))
    guard, steps = HostValueGuard(), []
    real_burst_forward = engine.runner._burst_forward

    def guarded_burst_forward(seqs):
        forward = real_burst_forward(seqs)  # once per burst: may build from the host

        def step(input_ids, positions, index):
            steps.append(index)
            with guard:
                return forward(input_ids, positions, index)

        return step

    monkeypatch.setattr(engine.runner, "_burst_forward", guarded_burst_forward)
    engine.generate(["class Node:", [5, 6, 7]], SamplingParams(max_tokens=12, **GREEDY))
    assert engine.device_loop.bursts > 0 and len(steps) > engine.device_loop.bursts, "liveness: bursts of steps ran"
    assert guard.calls == [], f"a burst step built from host values: {guard.calls}"


def test_graphs_are_keyed_by_block_count_too(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, block_size=4, max_model_len=256))
    graphs = engine.runner.graphs
    assert graphs.max_blocks == 64
    assert [graphs.blocks_for(n) for n in (1, 2, 3, 5, 33, 64, 70)] == [1, 2, 4, 8, 64, 64, 70]
    engine.generate(["import os"], SamplingParams(max_tokens=6, **GREEDY))  # a few blocks of 64
    keys = set(graphs._graphs)
    assert keys and all(bucket == 1 and blocks <= 8 for bucket, blocks in keys), keys
    assert all(buffers.block_tables.shape == key for key, (buffers, _) in graphs._graphs.items())


class FakeCuda:
    """torch.cuda's capture API as graphs.py uses it, recording streams, pools and captures."""

    def __init__(self) -> None:
        self.current, self.pools, self.captured = "caller", [], []
        self.capturing = self.poisoned = False
        fake = self

        class Stream:
            def __init__(self, name="capture"):
                self.name = name

            def wait_stream(self, other):
                pass

        class Graph:
            def capture_begin(self, pool):
                self.pool, fake.capturing = pool, True

            def capture_end(self):
                fake.capturing = False
                if fake.poisoned:
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
                fake.captured.append(self.pool)

            def replay(self):
                pass

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                self.saved, fake.current = fake.current, self.stream.name

            def __exit__(self, *exc):
                fake.current = self.saved

        self.Stream, self.CUDAGraph, self.stream = Stream, Graph, StreamContext
        self.current_stream = lambda device: Stream(fake.current)

    def graph_pool_handle(self):
        self.pools.append(object())
        return self.pools[-1]

    def synchronize(self, device):
        pass


def cuda_mode_graphs(checkpoint) -> tuple[Engine, DecodeGraphs, FakeCuda]:
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, block_size=4))
    graphs, fake = engine.runner.graphs, FakeCuda()
    graphs.mode, graphs._cuda = GraphMode.CUDA_GRAPHS, fake
    return engine, graphs, fake


def test_every_graph_shares_one_pool_and_capture_ahead_goes_largest_first(checkpoint):
    _, graphs, fake = cuda_mode_graphs(checkpoint)
    keys = graphs.capture_ahead(rows=3, tokens=9)  # batch buckets 1, 2, 4; block buckets 1, 2, 4
    assert set(keys) == {(b, n) for b in (1, 2, 4) for n in (1, 2, 4)}
    sizes = [b * n for b, n in keys]
    assert sizes == sorted(sizes, reverse=True) and keys[0] == (4, 4)
    assert len(fake.pools) == 1 and fake.captured == [fake.pools[0]] * len(keys)
    assert graphs.mode is GraphMode.CUDA_GRAPHS


def test_on_cuda_the_engine_captures_every_graph_its_config_can_replay_at_start(checkpoint, monkeypatch):
    fake = FakeCuda()

    class CapturingGraphs(DecodeGraphs):  # as on CUDA with the capture stream: the default there
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.mode, self._cuda = GraphMode.CUDA_GRAPHS, fake

    monkeypatch.setattr("engine.engine.DecodeGraphs", CapturingGraphs)
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, block_size=4, max_num_seqs=3, max_model_len=30))
    # Batches of up to 3 rows (buckets 1, 2, 4); tables of up to 8 blocks (30 tokens of 4: buckets 1 to 8).
    assert set(engine.runner.graphs._graphs) == {(b, n) for b in (1, 2, 4) for n in (1, 2, 4, 8)}
    assert len(fake.captured) == 12
    engine.generate(["import os", "def f"], SamplingParams(max_tokens=6, **GREEDY))
    assert len(fake.captured) == 12, "serving captured a graph: a stall for every stream"


def test_a_failed_capture_restores_the_stream_and_records_its_first_error(checkpoint, monkeypatch):
    engine, graphs, fake = cuda_mode_graphs(checkpoint)
    real_forward = graphs._forward

    def forward(ids, positions, tables):
        if fake.capturing:  # the two warm-ups pass; inside the capture the step syncs
            fake.poisoned = True
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing (an .item())")
        return real_forward(ids, positions, tables)

    monkeypatch.setattr(graphs, "_forward", forward)
    [result] = engine.generate(["import os"], SamplingParams(max_tokens=5, **GREEDY))
    assert fake.current == "caller", "the capture stream must not stay current after a failed capture"
    assert graphs.mode is GraphMode.REFUSED
    assert "operation not permitted when stream is capturing" in graphs.refusal, graphs.refusal
    assert result.finish_reason == "length" and len(result.token_ids) == 5, "decode went on eagerly"


def test_cpu_replay_matches_eager_exactly_in_bf16(checkpoint):
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in (10, 7)]
    prompts = ["class Node:", [5, 6, 7]]
    config = dict(model=str(checkpoint), dtype="bfloat16")
    eager = [r.token_ids for r in Engine(EngineConfig(**config, graphs=False)).generate(prompts, params)]
    engine = Engine(EngineConfig(**config, graphs=True, device_loop=True, verify_always=True))
    got = [r.token_ids for r in engine.generate(prompts, params)]
    records = list(engine.runner.graphs.verify.records)
    assert records and engine.runner.graphs.replays == len(records), "liveness: every replay was verified"
    assert engine.kv_cache.keys.dtype == torch.bfloat16
    assert all(r.max_abs_delta == 0.0 and r.argmax_agrees for r in records)
    assert got == eager
