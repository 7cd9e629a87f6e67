"""An engine's inner state as plain data, for operators: the device loop, capture, every live sequence
with the parked tokens at its row and their owner, the prefix cache's usage and hit rate, the
leak-prevention events and the replay checks.

`engine_state` reads only what the engine publishes for it (`Engine.snapshot()`, engine/host/snapshot.py)
and returns only JSON-ready values, so the serving layer can hand it to another thread, a heartbeat or a
socket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from engine.decode.graphs import VerifyRecord
from engine.host.snapshot import EngineSnapshot

RECENT = 64  # leak events and replay checks carried per snapshot; readers keep their own history
RECENT_DIVERGENT = 16  # divergent checks carried besides, even when many clean ones followed them


def engine_state(snapshot: EngineSnapshot, users: Mapping[str, str] | None = None) -> dict:
    """`snapshot`: Engine.snapshot(); `users`: request id -> the user it serves (the engine itself knows
    no users). A snapshot taken without its sequences gives None for them, and only their count: a
    Celery worker sends the list (the one part that grows with the load) only while a dashboard watches."""
    loop, slots, users = snapshot.device_loop, snapshot.parked_slots, users or {}
    parked_for: dict[int, int] = {}  # owner seq id -> tokens parked for it, over every row
    for slot_owner, tokens in slots.values():
        parked_for[slot_owner] = parked_for.get(slot_owner, 0) + tokens
    sequences: list[dict[str, object]] | None = None
    if snapshot.sequences is not None:
        sequences = []
        for seq in snapshot.sequences:
            owner = slots[seq.row][0] if seq.row in slots else None
            sequences.append({
                "request_id": seq.request_id, "seq_id": seq.seq_id, "user": users.get(seq.request_id, ""),
                "state": seq.state,
                # Running but left out of the last step: the bucket scheduler's waitlist (no state change).
                "waitlisted": seq.row is None and seq.completing,
                "prompt_tokens": seq.prompt_tokens, "tokens": seq.tokens, "max_tokens": seq.max_tokens,
                "row": seq.row, "parked": parked_for.get(seq.seq_id, 0),
                "slot_owner": owner, "owner_matches": owner is None or owner == seq.seq_id,
            })
    records = snapshot.replay_checks
    divergent = [r for r in records if r.divergent][-RECENT_DIVERGENT:]
    checks = sorted({r.replay: r for r in divergent + list(records[-RECENT:])}.values(), key=lambda r: r.replay)
    capture = snapshot.capture
    return {
        "device_loop": {"enabled": loop.enabled, "engaged": loop.enabled and not loop.killed, "killed": loop.killed,
                        "kill_reason": loop.kill_reason, "burst_length": loop.burst_length,
                        "generation": loop.generation, "bursts": loop.bursts, "resets": loop.resets,
                        "parked": sum(parked_for.values()), "foreign_dropped": loop.foreign_dropped},
        "parked_slots": [{"row": row, "owner": owner, "tokens": tokens, "owner_live": owner in snapshot.live_seq_ids}
                         for row, (owner, tokens) in sorted(slots.items())],
        "capture": {"mode": capture.mode, "reason": capture.reason, "graphs": capture.graphs,
                    "replays": capture.replays},
        "sequences": sequences,
        "sequence_count": len(snapshot.live_seq_ids),
        "leak_events": [event.as_dict() for event in snapshot.leak_events[-RECENT:]],
        "prefix_cache": _prefix_cache(snapshot),
        "replay_checks": [_check(record) for record in checks],
        # Which arithmetic route answers, and whether it promises the same bits whatever else runs (the
        # replay audit reports a difference there as a leak; elsewhere as a distance).
        "route": {"route": snapshot.identity.route, "invariant": snapshot.identity.invariant,
                  "weights_sha256": snapshot.identity.weights_sha256},
    }


def _prefix_cache(snapshot: EngineSnapshot) -> dict[str, object]:
    """Whether it is on and for whom, the share of the pool's blocks it holds, and its hit rate in tokens."""
    stats = snapshot.stats
    queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
    return {"enabled": snapshot.prefix_caching, "scope": snapshot.prefix_cache_scope,
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
