"""ModelRunner: one step's tokens for a batch of scheduled sequences, by the cheapest safe route.

Per row, in order: a parked token from the device loop (one-token decode steps only: the prefill
guard), else a device-loop burst for the rows that are all eligible greedy decodes with room, else
one ordinary forward and the sampler. Decode-only forwards (bursts included) run the graphs' decode
step (engine/graphs.py): with graphs on, the captured graph of their batch and block-count bucket is
replayed; with graphs off, the same step runs eagerly. Logits carry the ids of the sequences they were
computed for; sampling them for any other sequence fails the step loudly (AliasedLogitsError -> Error
through the funnel) instead of producing a plausible wrong token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, cast

import torch

from engine.device_loop import BurstForward, DeviceLoop, Taken
from engine.graphs import DecodeGraphs
from engine.host_copy import device_tensor
from engine.kv_cache import PagedKVCache
from engine.loader import LoadedModel
from engine.model import AttentionMetadata
from engine.sampler import SampleRequest, TokenLogprob, sample
from engine.sequence import Sequence


class AliasedLogitsError(RuntimeError):
    """Logits computed for some sequences were about to be sampled for others."""


@dataclass(frozen=True)
class TaggedLogits:
    values: torch.Tensor         # [B, V]
    seq_ids: tuple[int, ...]     # the sequence each row was computed for


def check_identity(logits: TaggedLogits, seqs: list[Sequence]) -> None:
    expected = tuple(seq.seq_id for seq in seqs)
    if logits.seq_ids != expected:
        raise AliasedLogitsError(f"logits computed for sequences {list(logits.seq_ids)} were about to be "
                                 f"sampled for {list(expected)}")


class ModelRunner:
    def __init__(self, loaded: LoadedModel, kv_cache: PagedKVCache, device_loop: DeviceLoop,
                 reserve: Callable[[Sequence, int], bool], length_limit: int, graphs: DecodeGraphs,
                 use_graphs: bool) -> None:
        self.loaded = loaded
        self.graphs = graphs
        self.use_graphs = use_graphs
        self.kv_cache = kv_cache
        self.device_loop = device_loop
        self.reserve = reserve  # the scheduler's: give a sequence KV room for N tokens, or say no
        self.length_limit = length_limit  # no sequence grows past this many tokens
        self.row_of: dict[int, int] = {}  # seq id -> its row in the last step's batch (the parked slot it reads)

    def run(self, seqs: list[Sequence], rows: list[SampleRequest]) -> tuple[list[int], list[TokenLogprob | None]]:
        tokens: list[int | None] = [None] * len(seqs)  # every row filled (cast) before each return
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        self.row_of = {seq.seq_id: row for row, seq in enumerate(seqs)}
        loop = self.device_loop
        if loop.active:
            for row, seq in enumerate(seqs):
                if seq.num_uncached == 1:  # the prefill guard: parked tokens never replace a prefill
                    taken = loop.take(row, seq)
                    if isinstance(taken, Taken):
                        tokens[row] = taken.token
        rest = [row for row, token in enumerate(tokens) if token is None]
        if not rest:
            return cast(list[int], tokens), logprobs
        rest_seqs = [seqs[row] for row in rest]
        loop.forget_parked(rest_seqs)
        burst = self._try_burst(rest, rest_seqs) if loop.active else None
        if burst is not None:
            for row, token in zip(rest, burst):
                tokens[row] = token
            return cast(list[int], tokens), logprobs
        logits = self.forward(rest_seqs)
        loop.host_served(rest_seqs)
        check_identity(logits, rest_seqs)
        sampled, records = sample(logits.values, [rows[row] for row in rest])
        for row, token, record in zip(rest, sampled, records):
            tokens[row], logprobs[row] = token, record
        return cast(list[int], tokens), logprobs

    @torch.inference_mode()  # cheaper than no_grad: no version counters or view tracking per op
    def forward(self, seqs: list[Sequence]) -> TaggedLogits:
        """Logits of each sequence's last fed token; feeds every token not yet in the cache."""
        device = self.loaded.device
        if all(s.num_uncached == 1 for s in seqs):  # decode only: the graphs' metadata, replayed or not
            ids = device_tensor([s.last_token for s in seqs], device)
            positions = device_tensor([s.num_tokens - 1 for s in seqs], device)
            graphable = self._graphable(seqs)
            batch = self.graphs.prepare([s.block_table for s in seqs], pad_rows=graphable)
            logits = (self.graphs.replay if graphable else self.graphs.eager)(batch, ids, positions)
            return TaggedLogits(logits, tuple(s.seq_id for s in seqs))
        metadata = AttentionMetadata.build(
            block_size=self.kv_cache.block_size, block_tables=[s.block_table for s in seqs],
            cached_lens=[s.num_cached for s in seqs], query_lens=[s.num_uncached for s in seqs],
            sliding_window=self.loaded.config.sliding_window, device=device, dtype=self.loaded.dtype)
        ids = device_tensor([t for s in seqs for t in s.uncached_tokens()], device)
        model = self.loaded.model
        hidden = model(ids, metadata.positions, metadata, self.kv_cache)
        return TaggedLogits(model.logits(hidden[metadata.last_token_index]), tuple(s.seq_id for s in seqs))

    def _try_burst(self, rows: list[int], seqs: list[Sequence]) -> list[int] | None:
        if not all(s.num_uncached == 1 and self.device_loop.can_burst(s) for s in seqs):
            return None
        steps = min([self.device_loop.burst_length]
                    + [s.params.resolved_max_tokens - len(s.output_ids) for s in seqs]
                    + [self.length_limit - s.num_tokens for s in seqs])
        # A burst writes keys/values for `steps` tokens per row: positions len-1 .. len+steps-2.
        if steps < 2 or not all(self.reserve(s, s.num_tokens + steps - 1) for s in seqs):
            return None
        first = self.device_loop.burst(rows, seqs, steps, self._burst_forward(seqs))
        if first is None:  # the burst faulted: what it wrote may be NaN, and masking cannot hide NaN
            self._scrub(seqs, steps)
        return first

    def _scrub(self, seqs: list[Sequence], steps: int) -> None:
        """Zero the KV slots a faulted burst wrote; host decode rewrites the ones it needs."""
        size = self.kv_cache.block_size
        slots = [s.block_table[p // size] * size + p % size
                 for s in seqs for p in range(s.num_tokens - 1, s.num_tokens - 1 + steps)]
        index = device_tensor(slots, self.loaded.device)
        self.kv_cache.keys[:, index] = 0
        self.kv_cache.values[:, index] = 0

    def _graphable(self, seqs: list[Sequence]) -> bool:
        return (self.use_graphs and DecodeGraphs.bucket_for(len(seqs)) is not None
                and all(s.num_uncached == 1 for s in seqs))

    def _burst_forward(self, seqs: list[Sequence]) -> BurstForward:
        """The forward of each burst step. The block tables were reserved for the whole burst, so they
        (and the graph key) are built once here; a step reads ids and positions from the device buffers
        the previous step committed and copies nothing from the host."""
        graphable = self._graphable(seqs)
        batch = self.graphs.prepare([s.block_table for s in seqs], pad_rows=graphable)
        step = self.graphs.replay if graphable else self.graphs.eager
        return lambda input_ids, positions, index: step(batch, input_ids, positions)
