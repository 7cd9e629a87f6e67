"""bench/stack_profile.py sorts py-spy's raw stacks of our server into the busy-server profile's categories."""

from __future__ import annotations

import pytest

from bench.stack_profile import format_table, profile_of

BOOT = "Thread._bootstrap (threading.py:1002);Thread._bootstrap_inner (threading.py:1045);Thread.run (threading.py:982)"
ENGINE = (f"thread (101): engine;{BOOT};EngineHost._run (workbench/serving/engine_host.py:213);"
          "EngineHost._step (workbench/serving/engine_host.py:268);Engine.step (engine/engine.py:171)")
RUNNER = f"{ENGINE};ModelRunner.run (engine/decode/runner.py:67)"
LOOP = ("thread (100): MainThread;<module> (workbench/serve.py:96);main (workbench/serve.py:92);"
        "Server.run (daphne/server.py:155);AsyncioSelectorReactor.run (twisted/internet/asyncioreactor.py:257);"
        "BaseEventLoop.run_forever (asyncio/base_events.py:607);BaseEventLoop._run_once (asyncio/base_events.py:1922)")
RAW = "\n".join([
    # engine: 6 forward, 2 sampling (one of them waiting on the draw workers), 1 detokenizing,
    # 1 publishing a snapshot, 1 scheduling, 1 other, 2 idle
    f"{RUNNER};ModelRunner._serve (engine/decode/runner.py:80);decoder_layer (engine/kernels/cpu/decoder_layer.py:48) 6",
    f"{RUNNER};ModelRunner._serve (engine/decode/runner.py:88);sample (engine/sampler.py:65);_draw (engine/sampler.py:100) 1",
    f"{RUNNER};ModelRunner._serve (engine/decode/runner.py:88);sample (engine/sampler.py:65);"
    "multinomial_draws (engine/sampling_draws.py:45);Future.result (concurrent/futures/_base.py:451);"
    "Condition.wait (threading.py:327) 1",
    f"{ENGINE};row_done (engine/postprocess.py:40);Detokenizer.step (engine/detokenizer.py:88) 1",
    f"thread (101): engine;{BOOT};EngineHost._run (workbench/serving/engine_host.py:214);"
    "EngineHost._publish_snapshot (workbench/serving/engine_host.py:319);take_snapshot (engine/host/snapshot.py:82) 1",
    f"{ENGINE};PagedScheduler.schedule (engine/scheduler/paged.py:50) 1",
    f"{ENGINE};row_done (engine/postprocess.py:40) 1",
    f"thread (101): engine;{BOOT};EngineHost._run (workbench/serving/engine_host.py:203);"
    "Queue.get (queue.py:171);Condition.wait (threading.py:327) 2",
    # event loop: 7 idle, 2 application (our stream, JSON), 1 transport
    f"{LOOP};EpollSelector.select (selectors.py:468) 7",
    f"{LOOP};Handle._run (asyncio/events.py:80);_push_all (workbench/serving/streams.py:95) 1",
    f"{LOOP};Handle._run (asyncio/events.py:80);dumps (json/__init__.py:238) 1",
    f"{LOOP};FileDescriptor.doWrite (twisted/internet/abstract.py:305);untilConcludes (twisted/python/util.py:760) 1",
    # a sync thread idle, a draw worker busy, an unnamed thread (started while sampled) idle
    f"thread (102): asyncio_0;{BOOT};_worker (concurrent/futures/thread.py:81) 4",
    f"thread (103): sampling-draws_0;{BOOT};_worker (concurrent/futures/thread.py:83);draw (engine/sampling_draws.py:55) 3",
    f"thread (104);{BOOT};_worker (concurrent/futures/thread.py:81) 2",
])


def test_categories_of_each_thread_group() -> None:
    profile = profile_of(RAW, seconds=2.0)
    engine = {name: profile.samples["engine", name] for name in
              ("forward", "sampling", "detokenizing", "publishing", "scheduling", "other", "idle")}
    assert engine == {"forward": 6, "sampling": 2, "detokenizing": 1, "publishing": 1, "scheduling": 1,
                      "other": 1, "idle": 2}
    assert profile.group_samples["engine"] == 14
    assert profile.share("engine", "forward") == pytest.approx(6 / 14)
    loop = {name: profile.samples["event loop", name] for name in ("idle", "application", "transport", "other")}
    assert loop == {"idle": 7, "application": 2, "transport": 1, "other": 0}
    assert profile.samples["sync threads", "idle"] == 4
    assert profile.samples["sampling draws", "busy"] == 3
    assert profile.samples["other threads", "idle"] == 2
    assert sum(profile.group_samples.values()) == sum(int(line.rsplit(" ", 1)[1]) for line in RAW.splitlines())


def test_table_puts_client_counts_side_by_side() -> None:
    table = format_table({1: profile_of(RAW, 2.0), 8: profile_of(RAW, 2.0)})
    assert table.splitlines()[0].split()[-4:] == ["1", "clients", "8", "clients"]
    assert "  forward" in table and table.count("43%") == 2  # forward: 6 of the engine's 14 samples


def test_stacks_without_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="--threads"):
        profile_of("main (x.py:1);f (x.py:2) 3", 1.0)
