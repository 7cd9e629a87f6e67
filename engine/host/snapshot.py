"""EngineSnapshot: what `Engine.snapshot()` publishes of its inner state for operators, as typed values.

The device loop, capture, the parked slots and their owners, the live sequences with the row each sat
at in the last step, the leak events and replay checks the engine still keeps, the prefix cache's
settings and the engine's counts. Taken on the engine's thread; engine/host/inspection.py turns it
into the dashboard's JSON without reading the engine itself.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from engine.decode.device_loop import DeviceLoop
from engine.decode.graphs import VerifyRecord
from engine.decode.leak_events import LeakEvent, LeakEventLog
from engine.decode.runner import ModelRunner
from engine.host.stats import EngineStats
from engine.reproduce import ModelIdentity
from engine.sequence import RunningCompletion, Sequence
from engine.step_data import RunnerOutput


@dataclass(frozen=True)
class DeviceLoopView:
    enabled: bool
    killed: bool  # the kill switch, which other engines of the process may share
    kill_reason: str | None
    burst_length: int
    generation: int
    bursts: int
    resets: int
    foreign_dropped: int  # parked tokens the owner tag dropped, since the engine started


@dataclass(frozen=True)
class CaptureView:
    mode: str
    reason: str  # in an operator's words, why the mode is what it is
    graphs: bool  # whether decode steps go through the graphs (ARC_GRAPHS)
    replays: int


@dataclass(frozen=True)
class SequenceView:
    request_id: str
    seq_id: int
    state: str  # the state's class name
    completing: bool  # RunningCompletion
    prompt_tokens: int
    tokens: int
    max_tokens: int | None
    row: int | None  # its row in the last step, None if it was left out


@dataclass(frozen=True)
class EngineSnapshot:
    device_loop: DeviceLoopView
    parked_slots: dict[int, tuple[int, int]]  # row -> (owner seq id, tokens parked)
    capture: CaptureView
    live_seq_ids: frozenset[int]
    sequences: tuple[SequenceView, ...] | None  # in arrival order; None where not asked for
    leak_events: tuple[LeakEvent, ...]  # every one the engine keeps, oldest first
    replay_checks: tuple[VerifyRecord, ...]  # likewise
    prefix_caching: bool
    prefix_cache_scope: str
    stats: EngineStats
    identity: ModelIdentity  # the arithmetic route that answers, and whether it is bit-invariant


def take_snapshot(device_loop: DeviceLoop, runner: ModelRunner, leak_events: LeakEventLog, live: Seq[Sequence],
                  last_step: RunnerOutput, stats: EngineStats, prefix_caching: bool, prefix_cache_scope: str,
                  identity: ModelIdentity, with_sequences: bool) -> EngineSnapshot:
    graphs, switch = runner.graphs, device_loop.kill_switch
    killed, kill_reason = switch.killed, switch.reason  # once: another engine may trip it meanwhile
    mode, reason = graphs.capture_state()
    return EngineSnapshot(
        device_loop=DeviceLoopView(device_loop.enabled, killed, kill_reason, device_loop.burst_length,
                                   device_loop.generation, device_loop.bursts, device_loop.resets,
                                   device_loop.parked.foreign_dropped),
        parked_slots=device_loop.parked.slots(),
        capture=CaptureView(mode, reason, runner.use_graphs, graphs.replays),
        live_seq_ids=frozenset(seq.seq_id for seq in live),
        sequences=_sequences(live, last_step) if with_sequences else None,
        leak_events=tuple(leak_events.recent()), replay_checks=tuple(graphs.verify.records),
        prefix_caching=prefix_caching, prefix_cache_scope=prefix_cache_scope, stats=stats, identity=identity)


def _sequences(live: Seq[Sequence], last_step: RunnerOutput) -> tuple[SequenceView, ...]:
    row_of = last_step.rows_by_seq_id()  # empty when nothing ran in the last step
    return tuple(SequenceView(seq.request_id, seq.seq_id, type(seq.state).__name__,
                              isinstance(seq.state, RunningCompletion), len(seq.prompt_ids), len(seq.output_ids),
                              seq.params.max_tokens, row_of.get(seq.seq_id))
                 for seq in live)
