"""bench/decode_launches.py counts the launches of a decode step: on the CPU, the ops that do work stand in
for kernel launches. Each layer adds the same ops, the matrix products among them, and the count leaves
the engine idle; bench/gpu_decode.py prints it beside a mode's speed and never fails a mode for it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.decode_launches import launches, launches_per_step
from engine import Engine, EngineConfig

PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture
def engine_with(tiny_checkpoint):
    def make(layers: int, **flags) -> Engine:
        checkpoint = tiny_checkpoint("llama", seed=2, num_hidden_layers=layers)
        return Engine(EngineConfig(model=str(checkpoint), **{"graphs": False, "device_loop": False, **flags}))

    return make


def test_each_layer_adds_the_same_launches_to_an_eager_step(engine_with):
    counted = {}
    for layers in (1, 2, 3):
        engine = engine_with(layers)
        counted[layers], by_name = launches_per_step(engine, PROMPTS, steps=4)
        assert not engine.has_unfinished_requests(), "the count's requests are aborted"
        # The projections: torch's matmuls, or on the CPU our dense kernel where it is built.
        assert by_name["aten::mm"] + by_name["workbench::dense_linear"] > 0, by_name
        assert not any(name in by_name for name in ("aten::view", "aten::empty", "aten::linear")), by_name
    assert counted[3] - counted[2] == counted[2] - counted[1] > 0, counted


def test_the_device_loops_bursts_are_counted_over_whole_bursts(engine_with):
    """Liveness of the loop's count: two bursts of 8 profiled, the same count per step as one."""
    engine = engine_with(1, graphs=True, device_loop=True)
    once, _ = launches_per_step(engine, PROMPTS, steps=8)
    twice, _ = launches_per_step(engine, PROMPTS, steps=16)
    assert once > 0 and abs(twice - once) <= 0.1 * once, (once, twice)


def test_on_cuda_the_api_calls_are_counted_not_the_devices_records_of_them():
    names = ["cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)",
             "void at::native::elementwise_kernel<128, 4>", "Memset (Device)", "aten::mm", "cudaStreamSynchronize"]
    prof = SimpleNamespace(events=lambda: [SimpleNamespace(name=name, cpu_children=[]) for name in names])
    assert launches(prof, "cuda") == {"cudaLaunchKernel": 1, "cuLaunchKernel": 1, "cudaGraphLaunch": 1,
                                      "cudaMemcpyAsync": 1}


def test_on_the_cpu_an_interpreted_triton_kernel_is_one_launch_whatever_it_runs_inside():
    """Under Triton's interpreter a kernel's run shows torch ops of its own (the interpreter's copies):
    the kernel's range counts once, the ops inside it not at all, the ops beside it as ever."""
    def event(name, children=()):
        node = SimpleNamespace(name=name, cpu_children=list(children), cpu_parent=None)
        for child in children:
            child.cpu_parent = node
        return node

    inside = [event("aten::copy_"), event("aten::mul", [event("aten::empty")])]
    kernel = event("triton::_paged_decode_kernel", inside)
    beside = event("aten::add")
    events = [kernel, *inside, *inside[1].cpu_children, beside]
    assert launches(SimpleNamespace(events=lambda: events), "cpu") == {"triton::_paged_decode_kernel": 1, "aten::add": 1}
    # Liveness: the same ops outside a kernel's range count.
    loose = [event("aten::copy_"), event("aten::mul")]
    assert launches(SimpleNamespace(events=lambda: loose), "cpu") == {"aten::copy_": 1, "aten::mul": 1}
