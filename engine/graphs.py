"""Captured decode steps: one graph per batch-size bucket, over static buffers, and replay verification.

A decode step for B sequences runs as the graph of the smallest bucket >= B. Its inputs live in static
buffers (input ids, positions, block tables); a replay reads only those buffers, so every input must
be copied in first. On CUDA the graph is a `torch.cuda.CUDAGraph` captured on a dedicated stream,
opt-in with ARC_CAPTURE_STREAM (without it the runner says INERT and runs the same static-buffer code
eagerly); a capture that fails is refused with the reason and the runner stays eager. On the CPU a
replay backend keeps the same discipline (a replay is the step recomputed from the static buffers
alone), so a replay whose inputs were not copied in diverges here exactly as it would on a GPU.

Padding rows of a bucket point at the KV cache's pad block, which no sequence ever owns.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.kv_cache import PagedKVCache
from engine.model import LlamaForCausalLM
from engine.model.attention import decode_metadata

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
    block_tables: torch.Tensor  # [bucket, max_blocks]
    logits: torch.Tensor | None = None  # [bucket, V], written by each replay


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
                 dtype: torch.dtype, device: torch.device, capture_stream: bool) -> None:
        self.model, self.kv_cache, self.max_blocks = model, kv_cache, max_blocks
        self.dtype, self.device = dtype, device
        self.sliding_window = model.config.sliding_window
        self.verify = VerifySettings()
        self.replays = 0
        self.refusal: str | None = None
        self._graphs: dict[int, tuple[StaticBuffers, Callable[[], None]]] = {}
        self._bisect_next = False
        if device.type != "cuda":
            self.mode = GraphMode.CPU_REPLAY
        elif capture_stream:
            self.mode = GraphMode.CUDA_GRAPHS
        else:
            self.mode = GraphMode.INERT
            log.info("ArcGraph INERT: ARC_CAPTURE_STREAM is off; decode runs eagerly over static buffers")

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

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: list[list[int]]) -> torch.Tensor:
        """Logits [B, V] of one decode step for B sequences (B <= the largest bucket)."""
        batch, bucket = len(block_tables), self.bucket_for(len(block_tables))
        buffers, replay = self._graph(bucket)
        inputs = self._padded(input_ids, positions, block_tables, bucket)
        self._copy_in(buffers, *inputs)
        self.replays += 1
        if self._should_verify():
            return self._verified_replay(buffers, replay, inputs, batch)
        replay()
        return buffers.logits[:batch].clone()

    # -- static buffers and capture -------------------------------------------------------------

    def _padded(self, input_ids, positions, block_tables, bucket: int) -> tuple[torch.Tensor, ...]:
        """The step's inputs at the bucket's shape; padding rows feed token 0 at position 0 into the
        pad block."""
        batch, pad = len(block_tables), self.kv_cache.pad_block
        rows = [table + [pad] * (self.max_blocks - len(table)) for table in block_tables]
        rows += [[pad] * self.max_blocks] * (bucket - batch)
        zeros = torch.zeros(bucket - batch, dtype=torch.long, device=self.device)
        return (torch.cat([input_ids, zeros]), torch.cat([positions, zeros]),
                torch.tensor(rows, dtype=torch.long, device=self.device))

    @staticmethod
    def _copy_in(buffers: StaticBuffers, input_ids, positions, block_tables) -> None:
        buffers.input_ids.copy_(input_ids)
        buffers.positions.copy_(positions)
        buffers.block_tables.copy_(block_tables)

    def _graph(self, bucket: int) -> tuple[StaticBuffers, Callable[[], None]]:
        if bucket not in self._graphs:
            pad = self.kv_cache.pad_block
            # Normal tensors even when first reached from inference mode: later steps copy into them
            # from outside it (device-loop bursts), which inference tensors refuse.
            with torch.inference_mode(False):
                buffers = self._new_buffers(bucket, pad)
            self._graphs[bucket] = (buffers, self._capture(buffers))
        return self._graphs[bucket]

    def _new_buffers(self, bucket: int, pad: int) -> StaticBuffers:
        return StaticBuffers(
            input_ids=torch.zeros(bucket, dtype=torch.long, device=self.device),
            positions=torch.zeros(bucket, dtype=torch.long, device=self.device),
            block_tables=torch.full((bucket, self.max_blocks), pad, dtype=torch.long, device=self.device))

    def _capture(self, buffers: StaticBuffers) -> Callable[[], None]:
        def eager() -> None:
            buffers.logits = self._forward(buffers.input_ids, buffers.positions, buffers.block_tables)

        if self.mode is not GraphMode.CUDA_GRAPHS:
            eager()  # the replay backend: the step recomputed from the static buffers alone
            return eager
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: allocator and kernel choices settle outside the graph
                    eager()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                eager()
            return graph.replay
        except Exception as exc:  # a refused capture must not take serving down: run eagerly
            self.mode, self.refusal = GraphMode.REFUSED, f"{type(exc).__name__}: {exc}"
            log.error("ArcGraph capture refused: %s; decode runs eagerly", self.refusal)
            eager()
            return eager

    @torch.inference_mode()
    def _forward(self, input_ids, positions, block_tables) -> torch.Tensor:
        metadata = decode_metadata(block_tables, positions, self.kv_cache.block_size, self.sliding_window, self.dtype)
        return self.model.logits(self.model(input_ids, positions, metadata, self.kv_cache))

    # -- verification ---------------------------------------------------------------------------

    def _should_verify(self) -> bool:
        v = self.verify
        return v.always or self._bisect_next or (v.every > 0 and self.replays % v.every == 0)

    def _verified_replay(self, buffers, replay, inputs, batch) -> torch.Tensor:
        """Replay, then the eager forward of the true inputs at the same shape, compared; the KV cache
        ends as the replay left it (the eager run writes the same slots, so they are saved and put
        back). A correct replay matches exactly: same operations on the same values."""
        input_ids, positions, tables = inputs
        slots = decode_metadata(tables, positions, self.kv_cache.block_size, None, self.dtype).slot_mapping
        cache = (self.kv_cache.keys, self.kv_cache.values)
        before = [c[:, slots].clone() for c in cache]
        replay_sums, eager_sums = [], []
        with self._layer_checksums(replay_sums):
            replay()
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
    def _layer_checksums(self, sink: list):
        """With the bisect on, append each layer's output checksum to `sink` while the block runs."""
        hooks = [layer.register_forward_hook(lambda _m, _i, out: sink.append(float(out.double().sum())))
                 for layer in self.model.model.layers] if self.verify.bisect else []
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def _record(self, buffers, batch, replayed, eager, replay_sums, eager_sums) -> None:
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
