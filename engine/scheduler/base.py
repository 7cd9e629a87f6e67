"""What every scheduler shares: the queues, the KV block pool, and the batch it hands the engine.

A scheduler decides which sequences run in the next forward and owns their KV blocks. It changes a
sequence's state only through `Sequence.set_state` (the funnel): RunningPrompt on admission, Waiting or
Swapped on preemption, FinishedIgnored for a prompt that can never fit. Finishing a sequence is the
engine's decision; the engine then calls `release` so the blocks go back to the pool.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

from engine.kv_cache import PagedKVCache, blocks_needed
from engine.sequence import FinishedIgnored, Sequence


@dataclass
class ScheduledBatch:
    sequences: list[Sequence] = field(default_factory=list)  # each feeds token_ids[num_cached:]
    ignored: list[Sequence] = field(default_factory=list)    # newly FinishedIgnored, to report to clients

    def __bool__(self) -> bool:
        return bool(self.sequences)


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_model_len: int = 2048


class SchedulerBase(ABC):
    def __init__(self, kv_cache: PagedKVCache, limits: SchedulerLimits) -> None:
        self.kv_cache = kv_cache
        self.limits = limits
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
        """The sequences of the next forward (and any newly ignored), their KV blocks granted."""

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Grow the sequence's blocks to hold `tokens` tokens if the pool has room; all or nothing."""
        missing = blocks_needed(tokens, self.block_size) - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > self.kv_cache.allocator.num_free:
            return False
        seq.block_table += self.kv_cache.allocator.allocate(missing)
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
