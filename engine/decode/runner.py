"""ModelRunner: one step's tokens for a scheduled batch, by the route the device loop's plan chose.

`run(batch, requests) -> RunnerOutput`. The device loop decides per row (engine/decode/device_loop.py:
DeviceLoop.plan): a parked token, else the burst the scheduler granted (its KV room is already in the block
tables), else one ordinary forward and the sampler; the runner carries the plan out and says where each
token came from. A row fed a prefill chunk that ends short of its prompt (chunked prefill,
engine/scheduler/paged.py) is in that forward too, but gets no logits and no token. Decode-only forwards
(bursts included) run the graphs' decode step (engine/decode/graphs.py): with graphs on, the captured graph
of their batch and block-count bucket is replayed; with graphs off, the same step runs eagerly. Logits carry
the ids of the sequences they were computed for; sampling them for any other sequence fails the step loudly
(AliasedLogitsError -> Error through the funnel) instead of producing a plausible wrong token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.decode import prompt_logprobs
from engine.decode.device_loop import BurstForward, DeviceLoop
from engine.decode.graphs import DecodeGraphs
from engine.kernels.host_copy import device_tensor
from engine.loading.loader import LoadedModel
from engine.model.attention_metadata import AttentionMetadata
from engine.sampler import SampleRequest, TokenLogprob, sample
from engine.scheduler.kv_cache import PagedKVCache
from engine.sequence import Sequence
from engine.step_data import BurstGrant, RowOutput, RunnerOutput, ScheduledBatch, TokenSource


class AliasedLogitsError(RuntimeError):
    """Logits computed for some sequences were about to be sampled for others."""


@dataclass(frozen=True)
class TaggedLogits:
    values: torch.Tensor         # [B, V]
    seq_ids: tuple[int, ...]     # the sequence each row was computed for
    # Per fed sequence (by its index in the forward) that asks for them: its chunk's prompt logprobs.
    prompt: dict[int, tuple[TokenLogprob, ...]] = field(default_factory=dict)


def check_identity(logits: TaggedLogits, seqs: list[Sequence]) -> None:
    expected = tuple(seq.seq_id for seq in seqs)
    if logits.seq_ids != expected:
        raise AliasedLogitsError(f"logits computed for sequences {list(logits.seq_ids)} were about to be "
                                 f"sampled for {list(expected)}")


class ModelRunner:
    def __init__(self, loaded: LoadedModel, kv_cache: PagedKVCache, device_loop: DeviceLoop, graphs: DecodeGraphs,
                 use_graphs: bool) -> None:
        self.loaded = loaded
        self.graphs = graphs
        self.use_graphs = use_graphs
        self.kv_cache = kv_cache
        self.device_loop = device_loop

    def run(self, batch: ScheduledBatch, requests: list[SampleRequest]) -> RunnerOutput:
        """One token per row of `batch` (`requests` row for row: what the sampler needs)."""
        seqs = batch.sequences
        plan = self.device_loop.plan(batch)
        served = {row: RowOutput(seqs[row].seq_id, token, None, TokenSource.PARKED)
                  for row, token in enumerate(plan.parked) if token is not None}
        if plan.unserved:
            served |= self._serve(plan.unserved, batch, plan.burst, requests)
        return RunnerOutput(tuple(served[row] for row in range(len(seqs))))

    def _serve(self, rows: tuple[int, ...], batch: ScheduledBatch, burst: BurstGrant | None,
               requests: list[SampleRequest]) -> dict[int, RowOutput]:
        """The rows no parked token served: the granted burst, or (without one, or if it faulted) the
        forward. A chunk that ends short of its prompt is fed and sampled from nothing (CHUNK)."""
        seqs = [batch.sequences[row] for row in rows]
        first = self._burst(burst, seqs) if burst is not None else None
        if first is not None:
            return {row: RowOutput(seq.seq_id, token, None, TokenSource.BURST)
                    for row, seq, token in zip(rows, seqs, first)}
        complete = [batch.completes(row) for row in rows]
        logits = self.forward(seqs, [batch.feeds(row) for row in rows], complete)
        sampled_rows = [row for row, done in zip(rows, complete) if done]
        sampled_seqs = [seq for seq, done in zip(seqs, complete) if done]
        check_identity(logits, sampled_seqs)
        prompt = {rows[index]: records for index, records in logits.prompt.items()}
        served = {row: RowOutput(seq.seq_id, None, None, TokenSource.CHUNK, prompt.get(row, ()))
                  for row, seq, done in zip(rows, seqs, complete) if not done}
        if sampled_rows:
            tokens, records = sample(logits.values, [requests[row] for row in sampled_rows])
            served |= {row: RowOutput(seq.seq_id, token, record, TokenSource.HOST, prompt.get(row, ()))
                       for row, seq, token, record in zip(sampled_rows, sampled_seqs, tokens, records)}
        return served

    @torch.inference_mode()  # cheaper than no_grad: no version counters or view tracking per op
    def forward(self, seqs: list[Sequence], feeds: list[int] | None = None,
                sampled: list[bool] | None = None) -> TaggedLogits:
        """Logits of each sequence's last fed token. Each feeds `feeds[i]` of its uncached tokens (all
        of them without `feeds`); with `sampled`, only the rows marked True get logits (a prefill
        chunk that ends short of its prompt needs none). A row that asks for prompt logprobs gets
        those of its chunk too (engine/decode/prompt_logprobs.py); a decode feeds no prompt token
        whose logprob is missing, so only the prefill route computes them."""
        device = self.loaded.device
        feeds = feeds if feeds is not None else [s.num_uncached for s in seqs]
        sampled = sampled if sampled is not None else [True] * len(seqs)
        kept = tuple(s.seq_id for s, keep in zip(seqs, sampled) if keep)
        if all(s.num_uncached == 1 for s in seqs):  # decode only: the graphs' metadata, replayed or not
            ids = device_tensor([s.last_token for s in seqs], device)
            positions = device_tensor([s.num_tokens - 1 for s in seqs], device)
            graphable = self._graphable(seqs)
            batch = self.graphs.prepare([s.block_table for s in seqs], pad_rows=graphable)
            logits = (self.graphs.replay if graphable else self.graphs.eager)(batch, ids, positions)
            return TaggedLogits(logits, kept)
        metadata = AttentionMetadata.build(
            block_size=self.kv_cache.block_size, block_tables=[s.block_table for s in seqs],
            cached_lens=[s.num_cached for s in seqs], query_lens=feeds,
            sliding_window=self.loaded.config.sliding_window, some_layers_windowed=self.loaded.config.mixes_windows,
            device=device, dtype=self.loaded.dtype)
        ids = device_tensor([t for s, n in zip(seqs, feeds) for t in s.uncached_tokens()[:n]], device)
        model = self.loaded.model
        hidden = model(ids, metadata.positions, metadata, self.kv_cache)
        last = metadata.last_token_index
        if not all(sampled):
            last = last[device_tensor([row for row, keep in enumerate(sampled) if keep], device)]
        return TaggedLogits(model.logits(hidden[last]), kept, self._prompt_logprobs(hidden, seqs, feeds))

    def _prompt_logprobs(self, hidden: torch.Tensor, seqs: list[Sequence],
                         feeds: list[int]) -> dict[int, tuple[TokenLogprob, ...]]:
        """The prompt logprobs of the rows that still want some, by row; `hidden` holds the rows' fed
        tokens one after another."""
        found: dict[int, tuple[TokenLogprob, ...]] = {}
        start = 0
        for index, (seq, fed) in enumerate(zip(seqs, feeds)):
            positions = prompt_logprobs.wanted_positions(seq, fed)
            if positions:
                top = seq.params.prompt_logprobs or 0
                found[index] = prompt_logprobs.records(self.loaded.model.logits, hidden[start:start + fed], seq,
                                                       positions, top)
            start += fed
        return found

    def _burst(self, grant: BurstGrant, seqs: list[Sequence]) -> list[int] | None:
        """The granted burst's first tokens; None if it faulted."""
        first = self.device_loop.burst(grant, seqs, self._burst_forward(seqs))
        if first is None:  # the burst faulted: what it wrote may be NaN, and masking cannot hide NaN
            self._scrub(seqs, grant.steps)
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
        """The forward of each burst step. The block tables were granted for the whole burst, so they
        (and the graph key) are built once here; a step reads ids and positions from the device buffers
        the previous step committed and copies nothing from the host."""
        graphable = self._graphable(seqs)
        batch = self.graphs.prepare([s.block_table for s in seqs], pad_rows=graphable)
        step = self.graphs.replay if graphable else self.graphs.eager
        return lambda input_ids, positions, index: step(batch, input_ids, positions)
