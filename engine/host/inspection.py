"""An engine's inner state as plain data, for operators: the device loop, capture, every live sequence
with the parked tokens at its row and their owner, the prefix cache's usage and hit rate, the
leak-prevention events and the replay checks.

`engine_state` is called on the engine's own thread (it reads the engine without locks) and returns
only JSON-ready values, so the serving layer can hand it to another thread, a heartbeat or a socket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from engine.sequence import RunningCompletion

if TYPE_CHECKING:
    from engine.decode.graphs import VerifyRecord
    from engine.engine import Engine

RECENT = 64  # leak events and replay checks carried per snapshot; readers keep their own history
RECENT_DIVERGENT = 16  # divergent checks carried besides, even when many clean ones followed them


def engine_state(engine: Engine, users: Mapping[str, str] | None = None, with_sequences: bool = True) -> dict:
    """`users`: request id -> the user it serves (the engine itself knows no users). Without
    `with_sequences` the per-sequence list (the one part that grows with the load) is left out, as
    None, and only counted: a Celery worker sends it only while a dashboard watches."""
    loop, runner, graphs = engine.device_loop, engine.runner, engine.runner.graphs
    slots, users = loop.parked.slots(), users or {}
    parked_for: dict[int, int] = {}  # owner seq id -> tokens parked for it, over every row
    for slot_owner, tokens in slots.values():
        parked_for[slot_owner] = parked_for.get(slot_owner, 0) + tokens
    live = engine.live_sequences()
    live_ids = {seq.seq_id for seq in live}
    row_of = engine.last_step.rows_by_seq_id()  # empty when nothing ran in the last step
    sequences: list[dict[str, object]] = []
    for seq in live if with_sequences else ():
        row = row_of.get(seq.seq_id)
        owner = slots[row][0] if row in slots else None
        sequences.append({
            "request_id": seq.request_id, "seq_id": seq.seq_id, "user": users.get(seq.request_id, ""),
            "state": type(seq.state).__name__,
            # Running but left out of the last step: the bucket scheduler's waitlist (no state change).
            "waitlisted": row is None and isinstance(seq.state, RunningCompletion),
            "prompt_tokens": len(seq.prompt_ids), "tokens": len(seq.output_ids), "max_tokens": seq.params.max_tokens,
            "row": row, "parked": parked_for.get(seq.seq_id, 0),
            "slot_owner": owner, "owner_matches": owner is None or owner == seq.seq_id,
        })
    mode, reason = graphs.capture_state()
    killed, kill_reason = loop.kill_switch.killed, loop.kill_switch.reason  # once: another engine may trip it meanwhile
    records = list(graphs.verify.records)
    divergent = [r for r in records if r.divergent][-RECENT_DIVERGENT:]
    checks = sorted({r.replay: r for r in divergent + records[-RECENT:]}.values(), key=lambda r: r.replay)
    return {
        "device_loop": {"enabled": loop.enabled, "engaged": loop.enabled and not killed, "killed": killed,
                        "kill_reason": kill_reason, "burst_length": loop.burst_length,
                        "generation": loop.generation, "bursts": loop.bursts, "resets": loop.resets,
                        "parked": sum(parked_for.values()), "foreign_dropped": loop.parked.foreign_dropped},
        "parked_slots": [{"row": row, "owner": owner, "tokens": tokens, "owner_live": owner in live_ids}
                         for row, (owner, tokens) in sorted(slots.items())],
        "capture": {"mode": mode, "reason": reason, "graphs": runner.use_graphs, "replays": graphs.replays},
        "sequences": sequences if with_sequences else None,
        "sequence_count": len(live),
        "leak_events": [event.as_dict() for event in engine.leak_events.recent(RECENT)],
        "prefix_cache": _prefix_cache(engine),
        "replay_checks": [_check(record) for record in checks],
        # Which arithmetic route answers, and whether it promises the same bits whatever else runs (the
        # replay audit reports a difference there as a leak; elsewhere as a distance).
        "route": {"route": engine.identity.route, "invariant": engine.identity.invariant,
                  "weights_sha256": engine.identity.weights_sha256},
    }


def _prefix_cache(engine: Engine) -> dict[str, object]:
    """Whether it is on and for whom, the share of the pool's blocks it holds, and its hit rate in tokens."""
    stats = engine.stats()
    queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
    return {"enabled": engine.scheduler.prefix_caching, "scope": engine.config.prefix_cache_scope,
            "usage": stats.prefix_cache_usage, "queries": queries, "hits": hits,
            "hit_rate": hits / queries if queries else None}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _check(record: VerifyRecord) -> dict:
    """A replay check for JSON: a non-finite delta (NaN, inf) becomes None, and `divergent` says so."""
    return {"replay": record.replay, "bucket": record.bucket, "rows": record.rows,
            "max_abs_delta": _finite(record.max_abs_delta), "divergent": record.divergent,
            "argmax_agrees": record.argmax_agrees,
            "layer_deltas": None if record.layer_deltas is None else [_finite(d) for d in record.layer_deltas],
            "first_divergent_layer": record.first_divergent_layer}
