"""What every scheduler shares: the queues, the KV block pool, and the batch it hands the engine.

A scheduler decides which sequences run in the next forward and owns their KV blocks. It changes a
sequence's state only through `Sequence.set_state` (the funnel): RunningPrompt on admission, Waiting or
Swapped on preemption, FinishedIgnored for a prompt that can never fit. Finishing a sequence is the
engine's decision; the engine then calls `release` so the blocks go back to the pool.

Its output for a step is a frozen `ScheduledBatch` (engine/step_data.py) that already holds every block
grant of the step: the room for the token each row feeds, and for a device-loop burst the room for all
its steps. The burst's rows and steps come from the `lookahead` the scheduler is built with (the device
loop's `DeviceLoop.lookahead`); the scheduler grants them only from free blocks, so a burst never
causes a preemption.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Callable

from engine.kv_cache import PagedKVCache, blocks_needed
from engine.sequence import FinishedIgnored, Sequence
from engine.step_data import BurstGrant, ScheduledBatch

# The burst a batch would run (rows and steps), or None: what the scheduler may grant KV room for.
Lookahead = Callable[[tuple[Sequence, ...]], BurstGrant | None]


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_model_len: int = 2048


class SchedulerBase(ABC):
    def __init__(self, kv_cache: PagedKVCache, limits: SchedulerLimits, lookahead: Lookahead | None = None) -> None:
        self.kv_cache = kv_cache
        self.limits = limits
        self.lookahead = lookahead  # None: no bursts are ever granted
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def block_size(self) -> int:
        return self.kv_cache.block_size

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @abstractmethod
    def schedule(self) -> ScheduledBatch:
        """The sequences of the next forward (and any newly ignored), with every block grant of the step
        made, a burst's lookahead included."""

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Grow the sequence's blocks to hold `tokens` tokens if the pool has room; all or nothing."""
        missing = blocks_needed(tokens, self.block_size) - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > self.kv_cache.allocator.num_free:
            return False
        seq.block_table += self.kv_cache.allocator.allocate(missing)
        return True

    def _batch(self, sequences: list[Sequence], ignored: list[Sequence]) -> ScheduledBatch:
        """The step's batch, with the burst the lookahead asks for if the pool can hold all of it now."""
        seqs = tuple(sequences)
        wanted = self.lookahead(seqs) if self.lookahead is not None and seqs else None
        burst = wanted if wanted is not None and self._grant(seqs, wanted) else None
        return ScheduledBatch(seqs, tuple(ignored), burst)

    def _grant(self, seqs: tuple[Sequence, ...], burst: BurstGrant) -> bool:
        """Room for every step of the burst in every row it serves, from free blocks, or none at all: a
        lookahead that would need a preemption (or that only some rows could have) is not granted."""
        # A burst writes keys/values for `steps` tokens per row: positions len-1 .. len+steps-2.
        rows = [(seqs[row], seqs[row].num_tokens + burst.steps - 1) for row in burst.rows]
        missing = sum(max(blocks_needed(tokens, self.block_size) - len(seq.block_table), 0) for seq, tokens in rows)
        if missing > self.kv_cache.allocator.num_free:
            return False
        for seq, tokens in rows:
            self.reserve(seq, tokens)  # cannot fail: the pool holds every missing block
        return True

    def release(self, seq: Sequence) -> None:
        """Forget a finished sequence and return its blocks. Safe to call for any queue it is in."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._free_blocks(seq)

    def _free_blocks(self, seq: Sequence) -> None:
        if seq.block_table:
            self.kv_cache.allocator.free(seq.block_table)
            seq.block_table = []
        seq.num_cached = 0

    def _ignore_if_never_fits(self, seq: Sequence, tokens: int) -> bool:
        """A sequence that needs more blocks than the whole pool has can never run: say so, once."""
        needed = blocks_needed(tokens, self.block_size)
        if needed <= self.kv_cache.num_blocks:
            return False
        self.waiting.remove(seq)
        seq.set_state(FinishedIgnored(
            f"needs {needed} KV blocks of {self.block_size} tokens ({tokens} tokens) but the whole pool has "
            f"{self.kv_cache.num_blocks}; shorten the prompt or max_tokens"))
        return True
