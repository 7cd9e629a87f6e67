"""The bucket scheduler: one length bucket per step, the rest waitlisted, urgency against starvation.

Running sequences are grouped by their current length and only one group runs each step; the others
wait on a waitlist *without a state change* (they stay RunningCompletion), and each step they wait
raises their urgency, so the bucket holding the most-waited sequence wins soon. This mirrors the
scheduler of the design notes, whose waitlist moves a running sequence aside where no funnel can see
it: the owner-tagged parked queue exists for exactly that shape.

Blocks are reserved whole at admission (every token that will be fed: prompt plus max_tokens minus
one, capped by the model length; the cached prefix blocks it takes count towards it), so this
scheduler never preempts; a sequence whose reservation exceeds the whole pool is FinishedIgnored.
"""

from __future__ import annotations

from collections import defaultdict

from engine.scheduler.base import Lookahead, SchedulerBase, SchedulerLimits
from engine.scheduler.kv_cache import PagedKVCache
from engine.sequence import Sequence
from engine.step_data import ScheduledBatch


class BucketScheduler(SchedulerBase):
    def __init__(self, kv_cache: PagedKVCache, limits: SchedulerLimits, lookahead: Lookahead | None = None,
                 prefix_caching: bool = True) -> None:
        super().__init__(kv_cache, limits, lookahead, prefix_caching)
        self._urgency: dict[int, int] = {}  # seq_id -> steps waited since it last ran

    def release(self, seq: Sequence) -> None:
        self._urgency.pop(seq.seq_id, None)
        super().release(seq)

    def schedule(self) -> ScheduledBatch:
        ignored = self._admit()
        if not self.running:
            return self._batch([], ignored)
        buckets: dict[int, list[Sequence]] = defaultdict(list)
        for seq in self.running:
            buckets[seq.num_tokens].append(seq)
        # Most urgent bucket first; among equals the larger one (more work per forward), then shorter.
        urgency = self._urgency
        chosen_length = max(buckets, key=lambda length: (max(urgency.get(s.seq_id, 0) for s in buckets[length]),
                                                          len(buckets[length]), -length))
        for length, seqs in buckets.items():
            for seq in seqs:
                urgency[seq.seq_id] = 0 if length == chosen_length else urgency.get(seq.seq_id, 0) + 1
        return self._batch(buckets[chosen_length], ignored)

    def _admission_tokens(self, seq: Sequence) -> int:
        """The whole reservation at admission: its prompt and every token it may generate (the last
        sampled token is never fed, so it needs no slot)."""
        return min(len(seq.prompt_ids) + seq.params.resolved_max_tokens, self.limits.max_model_len) - 1
