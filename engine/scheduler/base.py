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

Prefix caching (engine/scheduler/block_pool.py): on admission a sequence takes a reference to every cached
full block of its tokens' prefix found under its own cache scope and feeds only the rest; the last
token is always fed, since its logits are sampled, so at most (tokens - 1) // block_size blocks are
taken. As its blocks fill (`cache_computed`) they are named by their hashes and become immutable. No
write ever lands in such a block: prefill, decode and a burst write only at positions >= num_cached,
and a burst whose room would touch a shared or immutable block is refused (`_grant`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Callable

from engine.scheduler.block_pool import chain_hashes
from engine.scheduler.kv_cache import PagedKVCache, blocks_needed
from engine.sequence import FinishedIgnored, RunningPrompt, Sequence
from engine.step_data import BurstGrant, ScheduledBatch

log = logging.getLogger(__name__)

# The burst a batch would run (rows and steps), or None: what the scheduler may grant KV room for.
Lookahead = Callable[[tuple[Sequence, ...]], BurstGrant | None]


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_prefill_beside_decodes: int | None = None  # prompt tokens a step feeds while any stream decodes
    max_model_len: int = 2048


class SchedulerBase(ABC):
    def __init__(self, kv_cache: PagedKVCache, limits: SchedulerLimits, lookahead: Lookahead | None = None,
                 prefix_caching: bool = True) -> None:
        self.kv_cache = kv_cache
        self.limits = limits
        self.lookahead = lookahead  # None: no bursts are ever granted
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_caching = prefix_caching
        # Tokens admitted (queries) and those found cached (hits), as vLLM counts them; readmissions
        # after a recompute preemption count again.
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def block_size(self) -> int:
        return self.kv_cache.block_size

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @abstractmethod
    def schedule(self) -> ScheduledBatch:
        """The sequences of the next forward (and any newly ignored), with every block grant of the step
        made, a burst's lookahead included."""

    @abstractmethod
    def _admission_tokens(self, seq: Sequence) -> int:
        """The tokens a waiting sequence must have blocks for to be admitted."""

    def _admit(self, budget: int | None = None) -> list[Sequence]:
        """Admit waiting sequences, oldest first, while a running slot, their admission blocks and (where
        given) this step's token budget allow; returns those ignored (they could never fit)."""
        ignored: list[Sequence] = []
        for seq in list(self.waiting):
            tokens = self._admission_tokens(seq)
            if self._ignore_if_never_fits(seq, tokens):
                ignored.append(seq)
                continue
            if len(self.running) >= self.limits.max_num_seqs:
                break
            if budget is not None and budget < 1:  # this step's tokens are spent; it comes in next step
                break
            self._take_cached_prefix(seq)  # what it finds cached costs neither budget nor new blocks
            if not self.reserve(seq, tokens):
                self._free_blocks(seq)  # the cached blocks it took go back, still cached
                break
            self.waiting.remove(seq)
            seq.set_state(RunningPrompt())
            self.running.append(seq)
            self._admitted(seq)
            if budget is not None:
                budget -= min(seq.num_uncached, budget)  # a prompt longer than what is left is chunked
        return ignored

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Grow the sequence's blocks to hold `tokens` tokens if the pool has room; all or nothing."""
        missing = blocks_needed(tokens, self.block_size) - len(seq.block_table)
        if missing <= 0:
            return True
        if missing > self.kv_cache.pool.num_free:
            return False
        seq.block_table += self.kv_cache.pool.allocate(missing)
        return True

    def set_prefix_caching(self, enabled: bool) -> None:
        """Turning it off forgets every cached prefix, so turning it on again never finds a stale one."""
        if not enabled:
            self.kv_cache.pool.clear_cache()
        self.prefix_caching = enabled

    def _take_cached_prefix(self, seq: Sequence) -> None:
        """For a sequence about to be admitted with no blocks: hold the cached blocks of its prefix."""
        pool, size = self.kv_cache.pool, self.block_size
        hits: list[int] = []
        # A cached prefix has no logits: a sequence that still needs its prompt's logits computes it all.
        if self.prefix_caching and not seq.wants_prompt_logits:
            tokens = seq.token_ids
            seq.block_hashes = chain_hashes(tokens, size, seq.cache_scope, seq.block_hashes)
            hits = pool.lookup(seq.block_hashes[: (len(tokens) - 1) // size])
            pool.acquire(hits)
        seq.block_table = hits
        seq.num_registered = len(hits)  # found by their hashes: already named
        seq.num_cached = len(hits) * size

    def _admitted(self, seq: Sequence) -> None:
        """Count an admission's prefix-cache query and hits (the blocks it took stay taken)."""
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += seq.num_cached
        if seq.cached_tokens is None:
            seq.cached_tokens = min(seq.num_cached, len(seq.prompt_ids))

    def cache_computed(self, seq: Sequence) -> None:
        """Name the sequence's newly full, computed blocks by their hashes: cached, immutable, findable."""
        full = seq.num_cached // self.block_size
        if not self.prefix_caching or full <= seq.num_registered:
            return
        seq.block_hashes = chain_hashes(seq.token_ids[: full * self.block_size], self.block_size, seq.cache_scope,
                                        seq.block_hashes)
        for index in range(seq.num_registered, full):
            self.kv_cache.pool.register(seq.block_table[index], seq.block_hashes[index])
        seq.num_registered = full

    def _batch(self, sequences: list[Sequence], ignored: list[Sequence],
               chunks: tuple[int, ...] = ()) -> ScheduledBatch:
        """The step's batch, with the burst the lookahead asks for if the pool can hold all of it now.
        `chunks`: the tokens each row feeds (a chunked prefill); (): all it has."""
        seqs = tuple(sequences)
        wanted = self.lookahead(seqs) if self.lookahead is not None and seqs else None
        burst = wanted if wanted is not None and self._grant(seqs, wanted) else None
        return ScheduledBatch(seqs, tuple(ignored), burst, chunks)

    def _grant(self, seqs: tuple[Sequence, ...], burst: BurstGrant) -> bool:
        """Room for every step of the burst in every row it serves, from free blocks, or none at all: a
        lookahead that would need a preemption (or that only some rows could have) is not granted."""
        # A burst writes keys/values for `steps` tokens per row: positions len-1 .. len+steps-2.
        rows = [(seqs[row], seqs[row].num_tokens + burst.steps - 1) for row in burst.rows]
        if any(self._writes_shared(seq, seq.num_tokens - 1, tokens) for seq, tokens in rows):
            return False
        missing = sum(max(blocks_needed(tokens, self.block_size) - len(seq.block_table), 0) for seq, tokens in rows)
        if missing > self.kv_cache.pool.num_free:
            return False
        for seq, tokens in rows:
            self.reserve(seq, tokens)  # cannot fail: the pool holds every missing block
        return True

    def _writes_shared(self, seq: Sequence, start: int, end: int) -> bool:
        """Whether writing positions start..end-1 of the sequence would touch a block it may not write:
        one another sequence holds too, or a full cached one. Never true unless something upstream broke
        the positions >= num_cached rule; then the burst is refused rather than corrupt another's KV."""
        pool, size = self.kv_cache.pool, self.block_size
        held = seq.block_table[start // size: blocks_needed(end, size)]
        if any(pool.is_shared_or_immutable(block) for block in held):
            log.error("refused a burst for seq %d: its room would write into a shared or cached KV block",
                      seq.seq_id)
            return True
        return False

    def release(self, seq: Sequence) -> None:
        """Forget a finished sequence and return its blocks. Safe to call for any queue it is in."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._free_blocks(seq)

    def _free_blocks(self, seq: Sequence) -> None:
        if seq.block_table:
            self.kv_cache.pool.free(seq.block_table)
            seq.block_table = []
        seq.num_cached = seq.num_registered = 0

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
