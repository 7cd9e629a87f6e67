"""Captured decode graphs on the CPU replay backend, and replay verification with the layer bisect."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.decode.graphs import DecodeGraphs, GraphMode
from tests.reference import solo

GREEDY = dict(temperature=0, ignore_eos=True)
PROMPTS = ["class Node:", "import os", [5, 6, 7], "def f(x):\n    return"]


def test_buckets_round_up_and_stop():
    assert [DecodeGraphs.bucket_for(n) for n in (1, 2, 3, 5, 9, 200, 256)] == [1, 2, 4, 8, 16, 256, 256]
    assert DecodeGraphs.bucket_for(257) is None


@pytest.mark.parametrize("device_loop", [False, True], ids=["host-decode", "device-loop"])
def test_graph_replays_match_eager_exactly_and_leave_the_cache_alone(checkpoint, device_loop):
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in (12, 9, 7, 12)]
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, device_loop=device_loop, verify_always=True,
                                 layer_bisect=True))
    buckets = []
    real_replay = engine.runner.graphs.replay
    engine.runner.graphs.replay = lambda batch, ids, pos: (buckets.append(batch.rows), real_replay(batch, ids, pos))[1]
    # 4 sequences finishing at different steps: 3 rows replay bucket 4 (a padding row), 2 rows bucket 2.
    results = engine.generate(PROMPTS, params)
    assert 3 in buckets, "liveness: a bucket ran with a padding row"
    graphs = engine.runner.graphs
    assert graphs.mode is GraphMode.CPU_REPLAY and graphs.replays > 0
    records = list(graphs.verify.records)
    assert len(records) == graphs.replays, "liveness: every replay was verified"
    assert all(r.max_abs_delta == 0.0 and r.argmax_agrees and r.first_divergent_layer is None for r in records)
    assert all(r.layer_deltas and len(r.layer_deltas) == 3 for r in records)
    # Verification ran the eager forward too; the tokens are still each prompt's own.
    assert [r.token_ids for r in results] == [solo(checkpoint, p, q, graphs=False, device_loop=False)
                                              for p, q in zip(PROMPTS, params)]


def test_a_replay_whose_inputs_were_not_copied_in_diverges_and_the_bisect_names_layer_0(checkpoint, monkeypatch):
    params = SamplingParams(max_tokens=8, **GREEDY)
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, verify_always=True, layer_bisect=True))
    graphs = engine.runner.graphs
    real_copy_in = graphs._copy_in

    def stale_positions(buffers, input_ids, positions, tables):
        real_copy_in(buffers, input_ids, buffers.positions.clone(), tables)  # positions left from before

    monkeypatch.setattr(graphs, "_copy_in", stale_positions)
    [result] = engine.generate(["class Node:"], params)
    diverged = [r for r in graphs.verify.records if r.max_abs_delta > 0]
    assert diverged, "the stale replay must be caught"
    # Positions feed RoPE in the first layer's attention: that is where eager and replay part.
    assert diverged[0].first_divergent_layer == 0
    assert result.token_ids != solo(checkpoint, "class Node:", params, graphs=False, device_loop=False)


def test_verifying_every_nth_replay(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, verify_replays=3))
    engine.generate(["import os"], SamplingParams(max_tokens=10, **GREEDY))
    graphs = engine.runner.graphs
    assert [r.replay for r in graphs.verify.records] == list(range(3, graphs.replays + 1, 3))


def test_verification_is_set_by_the_constructor_and_changed_by_flags_between_steps(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, verify_replays=5, verify_always=True,
                                 layer_bisect=True))
    verify = engine.runner.graphs.verify
    assert (verify.every, verify.always, verify.bisect) == (5, True, True)
    engine.set_flag("ARC_GRAPH_VERIFY_ALWAYS", False)
    engine.set_flag("ARC_LAYER_BISECT", False)
    assert (verify.every, verify.always, verify.bisect) == (5, True, True), "flags wait for the step boundary"
    engine.step()
    assert (verify.every, verify.always, verify.bisect) == (5, False, False)
    assert engine.flags()["ARC_GRAPH_VERIFY_REPLAYS"] == 5


def test_graphs_flip_at_runtime(checkpoint):
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=False))
    engine.add_request("r", "import os", SamplingParams(max_tokens=10, **GREEDY))
    engine.step()
    engine.step()
    assert engine.runner.graphs.replays == 0
    engine.set_flag("ARC_GRAPHS", True)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert engine.runner.graphs.replays > 0 and engine.flags()["ARC_GRAPHS"] is True
    # Refused with what capture really is here, not the registry's description of what it could be.
    with pytest.raises(ValueError, match="fixed at start; capture here is cpu-replay: no CUDA device"):
        engine.set_flag("ARC_CAPTURE_STREAM", True)


def test_the_bisect_still_names_the_layer_when_replays_run_no_hooks(checkpoint, monkeypatch):
    """CUDA graph replays run no module hooks; simulated here by replays that hide the hooks."""
    engine = Engine(EngineConfig(model=str(checkpoint), graphs=True, verify_always=True, layer_bisect=True))
    graphs = engine.runner.graphs
    layers = engine.loaded.model.model.layers
    real_graph, real_copy_in = graphs._graph, graphs._copy_in

    def hookless(bucket):
        buffers, replay = real_graph(bucket)

        def replay_without_hooks():
            saved = [dict(layer._forward_hooks) for layer in layers]
            for layer in layers:
                layer._forward_hooks.clear()
            try:
                replay()
            finally:
                for layer, hooks in zip(layers, saved):
                    layer._forward_hooks.update(hooks)

        return buffers, replay_without_hooks

    def stale_positions(buffers, input_ids, positions, tables):
        real_copy_in(buffers, input_ids, buffers.positions.clone(), tables)

    monkeypatch.setattr(graphs, "_graph", hookless)
    monkeypatch.setattr(graphs, "_copy_in", stale_positions)
    engine.generate(["class Node:"], SamplingParams(max_tokens=6, **GREEDY))
    diverged = [r for r in graphs.verify.records if r.max_abs_delta > 0]
    assert diverged and diverged[0].layer_deltas and diverged[0].first_divergent_layer == 0
