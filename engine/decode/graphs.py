"""Captured decode steps: one graph per (batch-size bucket, block-count bucket), over static buffers,
and replay verification.

A decode step for B sequences whose longest block table has N blocks runs as the graph of the smallest
batch bucket >= B and block bucket >= N (powers of two, up to the length limit's block count): attention
gathers and attends over the bucket's blocks only, not over the whole length limit's. Its inputs live
in static buffers (input ids, positions, block tables); a replay reads only those buffers, so every
input must be copied in first. What stays the same for a batch within a burst (the key and the padded
block tables, on the device) is built once by `prepare`; a burst step copies device tensors only.

On CUDA the graph is a `torch.cuda.CUDAGraph` captured on a dedicated stream (engine/decode/cuda_capture.py)
into one memory pool that every bucket's graph shares, opt-in with ARC_CAPTURE_STREAM (without it the
runner says INERT and runs the same static-buffer code eagerly); a capture that fails is refused with
its first error and the runner stays eager. On the CPU a replay backend keeps the same discipline (a
replay is the step recomputed from the static buffers alone), so a replay whose inputs were not copied
in diverges here exactly as it would on a GPU.

Padding rows of a bucket point at the KV cache's pad block, which no sequence ever owns.

(Just over 300 lines, for a reason: replay verification runs the eager step on the very batch and
static buffers a replay read; apart from its two small records it is methods of the graphs object.)
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from engine.decode.cuda_capture import capture, root_cause
from engine.decode.block_table import DeviceBlockTable
from engine.model.llama import LlamaForCausalLM
from engine.model.attention_metadata import decode_metadata
from engine.scheduler.kv_cache import PagedKVCache, blocks_needed

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GraphMode(enum.Enum):
    CUDA_GRAPHS = "captured"      # torch.cuda.CUDAGraph on the capture stream
    CPU_REPLAY = "cpu-replay"     # the CPU backend: recompute from static buffers only
    INERT = "inert"               # CUDA without ARC_CAPTURE_STREAM: static buffers, eager launches
    REFUSED = "refused"           # capture failed; eager, and `refusal` says why


@dataclass
class StaticBuffers:
    input_ids: torch.Tensor     # [bucket]
    positions: torch.Tensor     # [bucket]
    block_tables: torch.Tensor  # [bucket, blocks]
    logits: torch.Tensor | None = None  # [bucket, V], written by each replay


@dataclass(frozen=True)
class DecodeBatch:
    """A decode batch's graph key and block tables, built once (for a burst: once for all its steps)."""
    rows: int
    bucket: int                 # rows padded to this many (== rows when no graph replays it)
    blocks: int                 # block tables padded to this many blocks
    block_tables: torch.Tensor  # [bucket, blocks] on the device; padding points at the pad block

    @property
    def key(self) -> tuple[int, int]:
        return self.bucket, self.blocks


@dataclass(frozen=True)
class VerifyRecord:
    """One replay checked against the eager forward of the same inputs."""
    replay: int
    bucket: int
    rows: int
    max_abs_delta: float  # NaN or inf when the replay (or the eager step) produced non-finite logits
    argmax_agrees: bool
    layer_deltas: tuple[float, ...] | None = None  # |eager - replay| of each layer's output checksum
    first_divergent_layer: int | None = None

    @property
    def divergent(self) -> bool:
        return not self.max_abs_delta == 0  # a NaN delta is the worst divergence, not none


@dataclass
class VerifySettings:
    every: int = 0          # ARC_GRAPH_VERIFY_REPLAYS: verify every Nth replay (0: off)
    always: bool = False    # ARC_GRAPH_VERIFY_ALWAYS
    bisect: bool = False    # ARC_LAYER_BISECT
    records: deque = field(default_factory=lambda: deque(maxlen=512))


class DecodeGraphs:
    def __init__(self, model: LlamaForCausalLM, kv_cache: PagedKVCache, max_blocks: int,
                 dtype: torch.dtype, device: torch.device, capture_stream: bool, *, verify_every: int = 0,
                 verify_always: bool = False, layer_bisect: bool = False) -> None:
        self.model, self.kv_cache, self.max_blocks = model, kv_cache, max_blocks
        self.dtype, self.device = dtype, device
        self.sliding_window = model.config.sliding_window
        self.some_layers_windowed = model.config.mixes_windows
        self.verify = VerifySettings(every=verify_every, always=verify_always, bisect=layer_bisect)
        self.replays = 0
        self.refusal: str | None = None
        self._graphs: dict[tuple[int, int], tuple[StaticBuffers, Callable[[], None]]] = {}
        self._table = DeviceBlockTable(BUCKETS[-1], max_blocks, kv_cache.pad_block, device)
        self._bisect_next = False
        self._cuda = torch.cuda  # the CUDA API capture goes through (tests pass a stand-in)
        # Made at the first capture: every graph shares them.
        self._pool: tuple[int, int] | None = None
        self._stream: torch.cuda.Stream | None = None
        if device.type != "cuda":
            self.mode = GraphMode.CPU_REPLAY
        elif capture_stream:
            self.mode = GraphMode.CUDA_GRAPHS
        else:
            self.mode = GraphMode.INERT
            log.info("ArcGraph INERT: ARC_CAPTURE_STREAM is off; decode runs eagerly over static buffers")

    def set_verification(self, *, every: int | None = None, always: bool | None = None,
                         bisect: bool | None = None) -> None:
        """Change replay verification between steps (the runtime flags); None leaves a setting as it is."""
        verify = self.verify
        verify.every = verify.every if every is None else every
        verify.always = verify.always if always is None else always
        verify.bisect = verify.bisect if bisect is None else bisect

    def capture_state(self) -> tuple[str, str]:
        """The capture mode and, in an operator's words, why it is what it is."""
        reasons = {
            GraphMode.CUDA_GRAPHS: "capturing CUDA graphs on a dedicated capture stream",
            GraphMode.CPU_REPLAY: "no CUDA device: the CPU replay backend recomputes each step from its static buffers",
            GraphMode.INERT: "ARC_CAPTURE_STREAM was off at start: eager launches over static buffers",
            GraphMode.REFUSED: f"capture refused: {self.refusal}",
        }
        return self.mode.value, reasons[self.mode]

    @staticmethod
    def bucket_for(batch: int) -> int | None:
        return next((b for b in BUCKETS if b >= batch), None)

    def _bucket(self, rows: int) -> int:
        """The batch bucket of `rows`, which the caller has checked is graphable."""
        bucket = self.bucket_for(rows)
        if bucket is None:
            raise ValueError(f"{rows} rows exceed the largest decode graph bucket ({BUCKETS[-1]})")
        return bucket

    def blocks_for(self, blocks: int) -> int:
        """The block bucket: the smallest power of two >= blocks, capped at the length limit's count (but
        never fewer than the table has: a table wider than the limit is padded to nothing, not cut)."""
        return max(min(1 << max(blocks - 1, 0).bit_length(), self.max_blocks), blocks)

    def prepare(self, block_tables: list[list[int]], pad_rows: bool = True) -> DecodeBatch:
        """The batch's key and padded block tables, on the device (engine/decode/block_table.py writes
        and copies only the rows that changed since the last batch). pad_rows: pad to the batch bucket,
        for a graph replay."""
        rows = len(block_tables)
        bucket = self._bucket(rows) if pad_rows else rows
        blocks = self.blocks_for(max(len(t) for t in block_tables))
        return DecodeBatch(rows, bucket, blocks, self._table.table(block_tables, bucket, blocks))

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: list[list[int]]) -> torch.Tensor:
        """Logits [B, V] of one decode step for B sequences (B <= the largest bucket)."""
        return self.replay(self.prepare(block_tables), input_ids, positions)

    def replay(self, batch: DecodeBatch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [rows, V] of the batch's graph replayed over these ids and positions (device tensors)."""
        buffers, replay = self._graph(batch.key)
        self._copy_in(buffers, input_ids, positions, batch.block_tables)
        self.replays += 1
        if self._should_verify():
            return self._verified_replay(buffers, replay, batch, input_ids, positions)
        replay()
        assert buffers.logits is not None  # every replay writes them
        return buffers.logits[: batch.rows].clone()

    def eager(self, batch: DecodeBatch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The same decode step without a graph (graphs off): same metadata, same shapes per row."""
        return self._forward(input_ids, positions, batch.block_tables[: batch.rows])

    def capture_ahead(self, rows: int, tokens: int) -> list[tuple[int, int]]:
        """Capture every graph a batch of up to `rows` sequences of up to `tokens` tokens can use,
        largest first: later (smaller) captures then fit in what the shared pool already holds."""
        top_bucket, top_blocks = self._bucket(rows), self.blocks_for(blocks_needed(tokens, self.kv_cache.block_size))
        block_buckets = {min(1 << k, top_blocks) for k in range(top_blocks.bit_length() + 1)}
        keys = [(b, n) for b in BUCKETS if b <= top_bucket for n in block_buckets]
        keys.sort(key=lambda key: (key[0] * key[1], key), reverse=True)
        started = time.perf_counter()
        for key in keys:
            self._graph(key)
        log.info("decode graphs: %d keys up to %d rows and %d blocks ready in %.1f s (%s)", len(keys), top_bucket,
                 top_blocks, time.perf_counter() - started, self.capture_state()[1])
        return keys

    # -- static buffers and capture -------------------------------------------------------------

    @staticmethod
    def _copy_in(buffers: StaticBuffers, input_ids: torch.Tensor, positions: torch.Tensor,
                 block_tables: torch.Tensor) -> None:
        """Device-to-device copies only; padding rows feed token 0 at position 0 (into the pad block)."""
        rows = input_ids.shape[0]
        buffers.input_ids[:rows].copy_(input_ids)
        buffers.input_ids[rows:].zero_()
        buffers.positions[: positions.shape[0]].copy_(positions)
        buffers.positions[positions.shape[0]:].zero_()
        buffers.block_tables.copy_(block_tables)

    def _graph(self, key: tuple[int, int]) -> tuple[StaticBuffers, Callable[[], None]]:
        if key not in self._graphs:
            # Normal tensors even when first reached from inference mode: later steps copy into them
            # from outside it (device-loop bursts), which inference tensors refuse.
            with torch.inference_mode(False):
                buffers = self._new_buffers(*key)
            self._graphs[key] = (buffers, self._capture(buffers))
        return self._graphs[key]

    def _new_buffers(self, bucket: int, blocks: int) -> StaticBuffers:
        return StaticBuffers(
            input_ids=torch.zeros(bucket, dtype=torch.long, device=self.device),
            positions=torch.zeros(bucket, dtype=torch.long, device=self.device),
            block_tables=torch.full((bucket, blocks), self.kv_cache.pad_block, dtype=torch.long, device=self.device))

    def _capture(self, buffers: StaticBuffers) -> Callable[[], None]:
        def eager() -> None:
            buffers.logits = self._forward(buffers.input_ids, buffers.positions, buffers.block_tables)

        if self.mode is not GraphMode.CUDA_GRAPHS:
            eager()  # the replay backend: the step recomputed from the static buffers alone
            return eager
        try:
            if self._pool is None or self._stream is None:  # made together, at the first capture
                self._pool, self._stream = self._cuda.graph_pool_handle(), self._cuda.Stream(self.device)
            return capture(eager, self._stream, self._pool, self.device, self._cuda)
        except Exception as exc:  # a refused capture must not take serving down: run eagerly
            self.mode, self.refusal = GraphMode.REFUSED, root_cause(exc)
            log.error("ArcGraph capture refused: %s; decode runs eagerly", self.refusal)
            eager()
            return eager

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        metadata = decode_metadata(block_tables, positions, self.kv_cache.block_size, self.sliding_window, self.dtype,
                                   self.some_layers_windowed)
        return self.model.logits(self.model(input_ids, positions, metadata, self.kv_cache))

    # -- verification ---------------------------------------------------------------------------

    def _should_verify(self) -> bool:
        v = self.verify
        return v.always or self._bisect_next or (v.every > 0 and self.replays % v.every == 0)

    def _verified_replay(self, buffers: StaticBuffers, replay: Callable[[], None], decode: DecodeBatch,
                         true_ids: torch.Tensor, true_positions: torch.Tensor) -> torch.Tensor:
        """Replay, then the eager forward of the true inputs at the same shape, compared; the KV cache
        ends as the replay left it (the eager run writes the same slots, so they are saved and put
        back). A correct replay matches exactly: same operations on the same values."""
        batch, zeros = decode.rows, torch.zeros(decode.bucket - decode.rows, dtype=torch.long, device=self.device)
        input_ids, positions, tables = torch.cat([true_ids, zeros]), torch.cat([true_positions, zeros]), decode.block_tables
        slots = decode_metadata(tables, positions, self.kv_cache.block_size, None, self.dtype).slot_mapping
        cache = (self.kv_cache.keys, self.kv_cache.values)
        before = [c[:, slots].clone() for c in cache]
        replay_sums: list[float] = []
        eager_sums: list[float] = []
        with self._layer_checksums(replay_sums):
            replay()
        assert buffers.logits is not None  # every replay writes them
        replayed = buffers.logits[:batch].clone()
        after = [c[:, slots].clone() for c in cache]
        for c, saved in zip(cache, before):
            c[:, slots] = saved
        if self.verify.bisect and not replay_sums:
            # A CUDA graph replay runs no module hooks: take the replay side's per-layer checksums from
            # the same step recomputed eagerly over the static buffers, which is what the graph reads.
            with self._layer_checksums(replay_sums):
                self._forward(buffers.input_ids, buffers.positions, buffers.block_tables)
            for c, saved in zip(cache, before):
                c[:, slots] = saved
        with self._layer_checksums(eager_sums):
            eager = self._forward(input_ids, positions, tables)[:batch]
        for c, saved in zip(cache, after):
            c[:, slots] = saved
        self._record(buffers, batch, replayed, eager, replay_sums, eager_sums)
        return replayed

    @contextmanager
    def _layer_checksums(self, sink: list[float]) -> Iterator[None]:
        """With the bisect on, append each layer's output checksum to `sink` while the block runs."""
        hooks = [layer.register_forward_hook(lambda _m, _i, out: sink.append(float(out.double().sum())))
                 for layer in self.model.model.layers] if self.verify.bisect else []
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def _record(self, buffers: StaticBuffers, batch: int, replayed: torch.Tensor, eager: torch.Tensor,
                replay_sums: list[float], eager_sums: list[float]) -> None:
        delta = float((replayed.float() - eager.float()).abs().max())
        agrees = bool((replayed.argmax(-1) == eager.argmax(-1)).all())
        layer_deltas = first = None
        if replay_sums and eager_sums:
            layer_deltas = tuple(abs(a - b) for a, b in zip(eager_sums, replay_sums))
            first = next((i for i, d in enumerate(layer_deltas) if not d == 0), None)
        record = VerifyRecord(self.replays, buffers.input_ids.shape[0], batch, delta, agrees, layer_deltas, first)
        self.verify.records.append(record)
        # A divergent step is bisected again at the next replay (steps N and N+1 of the notes).
        self._bisect_next = self.verify.bisect and record.divergent and not self._bisect_next
        if record.divergent:
            log.warning("ArcGraph replay verification: replay %d max |delta| %.3e, argmax %s, first divergent "
                        "layer %s", self.replays, delta, "agrees" if agrees else "DIFFERS", first)
