"""The paged scheduler: KV blocks on demand, preemption when they run out, continuous batching.

Each step, running sequences come first, oldest first: each gets room for the token it feeds. When
the pool is empty the youngest running sequence is preempted: swapped to host memory when a swap
pool is configured and has room, otherwise dropped for recompute (its blocks freed, its prompt and
the tokens it already generated prefilled again later; with prefix caching its own full blocks stay
cached, so only what was evicted meanwhile is computed again). Then waiting sequences are admitted, oldest
first, while blocks, the sequence limit and the token budget allow. A prompt that needs more blocks
than the whole pool has is finished as FinishedIgnored with the reason.

Chunked prefill: each step feeds at most `max_num_batched_tokens` tokens (`_chunks`). Decodes come
first, one token each; a prompt longer than what is left is fed in chunks over several steps, in the
same forwards as the running decodes, so a long paste does not freeze the other streams. Its blocks
are reserved whole at admission; each chunk's full blocks are cached as soon as it is fed (the
engine's `Postprocess.chunk_fed`); a cached prefix is skipped and the chunks start after it. A sequence still
mid-prefill feeds more than one token, so it is never served a parked token nor given a burst
(engine/decode/device_loop.py: both need a one-token decode).
"""

from __future__ import annotations

from collections import deque

import torch

from engine.scheduler.base import Lookahead, SchedulerBase, SchedulerLimits
from engine.scheduler.kv_cache import PagedKVCache, SwapBlockAllocator, blocks_needed
from engine.sequence import RunningCompletion, RunningPrompt, Sequence, Swapped, Waiting
from engine.step_data import ScheduledBatch


class SwapSpace:
    """Host-memory copies of preempted sequences' KV blocks."""

    def __init__(self, kv_cache: PagedKVCache, num_blocks: int) -> None:
        self.kv_cache = kv_cache
        shape = (kv_cache.keys.shape[0], num_blocks * kv_cache.block_size, *kv_cache.keys.shape[2:])
        pin = kv_cache.keys.device.type == "cuda"
        self.keys = torch.zeros(shape, dtype=kv_cache.keys.dtype, pin_memory=pin)
        self.values = torch.zeros(shape, dtype=kv_cache.keys.dtype, pin_memory=pin)
        self.allocator = SwapBlockAllocator(num_blocks)
        self.host_tables: dict[int, list[int]] = {}

    def _slots(self, blocks: list[int]) -> torch.Tensor:
        size = self.kv_cache.block_size
        return (torch.tensor(blocks)[:, None] * size + torch.arange(size)).flatten()

    def swap_out(self, seq: Sequence) -> bool:
        if len(seq.block_table) > self.allocator.num_free:
            return False
        host = self.allocator.allocate(len(seq.block_table))
        src, dst = self._slots(seq.block_table).to(self.kv_cache.keys.device), self._slots(host)
        self.keys[:, dst] = self.kv_cache.keys[:, src].cpu()
        self.values[:, dst] = self.kv_cache.values[:, src].cpu()
        self.host_tables[seq.seq_id] = host
        return True

    def swap_in(self, seq: Sequence, device_blocks: list[int]) -> None:
        host = self.host_tables.pop(seq.seq_id)
        src, dst = self._slots(host), self._slots(device_blocks).to(self.kv_cache.keys.device)
        self.kv_cache.keys[:, dst] = self.keys[:, src].to(self.kv_cache.keys.device)
        self.kv_cache.values[:, dst] = self.values[:, src].to(self.kv_cache.keys.device)
        self.allocator.free(host)

    def discard(self, seq: Sequence) -> None:
        host = self.host_tables.pop(seq.seq_id, None)
        if host:
            self.allocator.free(host)


class PagedScheduler(SchedulerBase):
    def __init__(self, kv_cache: PagedKVCache, limits: SchedulerLimits, swap_blocks: int = 0,
                 lookahead: Lookahead | None = None, prefix_caching: bool = True) -> None:
        super().__init__(kv_cache, limits, lookahead, prefix_caching)
        self.swapped: deque[Sequence] = deque()
        self.swap_space = SwapSpace(kv_cache, swap_blocks) if swap_blocks else None

    def release(self, seq: Sequence) -> None:
        if seq in self.swapped:
            self.swapped.remove(seq)
        if self.swap_space is not None:
            self.swap_space.discard(seq)
        super().release(seq)

    def schedule(self) -> ScheduledBatch:
        ignored: list[Sequence] = []
        preempted = self._keep_running_room()
        _, budget = self._chunks()  # what the running prefills leave of this step's prompt budget
        if not preempted:
            budget = self._swap_in(budget)
            if not self.swapped:  # swapped sequences come back before anyone new is admitted
                ignored = self._admit(budget)
        chunks, _ = self._chunks()  # again: admission and swap-in added rows
        return self._batch(list(self.running), ignored, tuple(chunks))

    def _prompt_budget(self) -> int:
        """The prompt tokens this step may feed: the step's budget less one token per decode, and
        while anyone decodes, at most max_prefill_beside_decodes (a step's time, on a CPU, grows with
        every token it feeds, and each decode waits for the whole step). With no decode to delay, a
        prompt takes the whole budget."""
        decodes = sum(1 for s in self.running if s.num_uncached == 1)
        left = self.limits.max_num_batched_tokens - decodes
        beside = self.limits.max_prefill_beside_decodes
        return min(left, beside) if decodes and beside is not None else left

    def _chunks(self) -> tuple[list[int], int]:
        """The tokens each running sequence feeds this step, row by row, and the prompt budget they
        leave (negative where it was overrun), within the token budget:
        every decode its one token first, then each prefill, oldest first, as much of its prompt as
        the prompt budget has left. Every running sequence feeds at least one token, so none sits a
        step out (its row would shift the others' parked slots) and none starves: the budget can be
        overrun by one token per prefill past the first."""
        left = self._prompt_budget()
        chunks = []
        for seq in self.running:
            chunk = 1 if seq.num_uncached == 1 else max(1, min(seq.num_uncached, left))
            if seq.num_uncached > 1:
                left -= chunk
            chunks.append(chunk)
        return chunks, left

    def _keep_running_room(self) -> bool:
        """Give every running sequence a slot for the token it feeds, preempting the youngest when
        the pool is dry. Returns whether anything was preempted."""
        by_age = sorted(self.running, key=lambda s: s.timings.arrival)
        kept, preempted = [], False
        while by_age:
            seq = by_age.pop(0)
            while not self.reserve(seq, seq.num_tokens):
                victim = by_age.pop() if by_age else seq
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                kept.append(seq)
        self.running = kept
        return preempted

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        if self.swap_space is not None and self.swap_space.swap_out(seq):
            # Shared blocks were only read by the copy: dropping this sequence's reference leaves them
            # to their other holders, and its own full blocks stay cached. It comes back in private blocks.
            self.kv_cache.pool.free(seq.block_table)
            seq.block_table = []  # num_cached stays: the host copy holds those tokens
            seq.num_registered = 0  # its new blocks are named again as cache_computed sees them
            seq.set_state(Swapped())
            self.swapped.append(seq)
            return
        self._free_blocks(seq)
        seq.set_state(Waiting())
        self.waiting.appendleft(seq)  # it was running: it goes back first

    def _swap_in(self, budget: int) -> int:
        while self.swapped and len(self.running) < self.limits.max_num_seqs:
            seq = self.swapped[0]
            assert self.swap_space is not None  # only a swap space's swap_out fills self.swapped
            needed = blocks_needed(seq.num_tokens, self.block_size)
            if needed > self.kv_cache.pool.num_free or budget < 1:
                break
            self.swapped.popleft()
            blocks = self.kv_cache.pool.allocate(needed)
            self.swap_space.swap_in(seq, blocks[: len(self.swap_space.host_tables[seq.seq_id])])
            seq.block_table = blocks
            # Swapped out mid-prefill, it goes on with its next chunk; otherwise it decodes.
            seq.set_state(RunningPrompt() if seq.num_uncached > 1 else RunningCompletion())
            self.running.append(seq)
            budget -= min(seq.num_uncached, budget)
        return budget

    def _admission_tokens(self, seq: Sequence) -> int:
        """Blocks for the whole prompt now, its chunks or not: a chunked prefill never waits for room.
        Its decode's blocks come on demand."""
        return seq.num_tokens
