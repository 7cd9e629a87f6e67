"""Paged decode attention in Triton: one query token per sequence over its keys in the paged KV cache.

The torch decode path (engine/model/attention.py) gathers every decode's blocks into one padded tensor and
runs SDPA with an additive mask: it copies the keys and values it reads, pays for the longest decode's
length in every row, and the mask rules out SDPA's flash kernel. Here each program reads the cache in
place through the block table, only the keys its sequence may see:

- GQA: one program per (sequence, KV head, partition) attends all the query heads that share the KV
  head, so each key and value is read from memory once for the group;
- split-KV: the keys are cut into partitions of PARTITION tokens, attended in parallel (a long context
  fills the device at batch 1), each leaving its normalized output and its log-sum-exp; a second kernel
  merges them (flash-decoding's reduce). With one partition the first kernel writes the output itself;
- no gather, no mask, no padding: a program walks its partition's tokens from the first key the
  sequence may see (its sliding window's start) to its position, each token's slot read from the table.

Each row's work is bounded by its own length: the grid is as wide as the bucket's block tables (it depends
on shapes only, so a captured graph replays it), but a program whose partition lies wholly past its
row's position, or wholly before its sliding window, returns at once, reading and writing nothing, and
the merge reads only the row's own partitions, ceil(length / PARTITION) of them less those before the
window. A short row beside a long one costs one idle program per unused partition, not a partition's
keys, stores and merge. A row's result does not depend on the other rows: partitions have a fixed size,
so a sequence's split depends on its own length (and window) only.

Cache layout as engine/scheduler/kv_cache.py allocates it: [slots, Hkv, D] per layer, slot = block *
block_size + offset. Scores, softmax and the weighted sum accumulate in float32; the output is rounded to
the query dtype once. Runs on CUDA, and on the CPU under TRITON_INTERPRET=1 (tests only: the interpreter
is slow).
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path serves where Triton is missing (the CPU image, a bare venv)
    triton = None

PARTITION = 128   # keys per split-KV partition: a fixed size, so a row's split never depends on the batch
TILE = 32         # keys per inner-loop step; PARTITION is a multiple of it
MERGE_CHUNK = 16  # partitions the merge reads at a time
_LOG2E = 1.4426950408889634


def available() -> bool:
    """Whether Triton imports here (it compiles for CUDA, or interprets under TRITON_INTERPRET=1)."""
    return triton is not None


def unavailable_reason() -> str | None:
    return None if available() else "the triton package is not installed"


if triton is not None:

    @triton.jit
    def _partition_kernel(q_ptr, key_ptr, value_ptr, tables_ptr, positions_ptr,
                          out_ptr, part_out_ptr, part_lse_ptr,
                          scale_log2, window,
                          stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_tb,
                          stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                          GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, PARTITION_SIZE: tl.constexpr,
                          TILE_SIZE: tl.constexpr, WINDOWED: tl.constexpr, SPLIT: tl.constexpr,
                          PRECISION: tl.constexpr):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        part = tl.program_id(2)
        length = tl.load(positions_ptr + seq).to(tl.int32) + 1     # keys 0 .. position
        lo = part * PARTITION_SIZE
        hi = tl.minimum(lo + PARTITION_SIZE, length)
        if WINDOWED:
            lo = tl.maximum(lo, length - window)                     # keys after position - window
        if lo >= hi:  # wholly past the row's position or before its window: not one of its partitions
            return
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kv_head * GROUP + g                                  # the query heads of this KV head
        head_ok = g < GROUP
        d_ok = d < HEAD_DIM
        q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=head_ok[:, None] & d_ok[None, :], other=0.0).to(key_ptr.dtype.element_ty)  # [G, D]
        row_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        # Tiles are aligned to the partition, so a key's tile does not depend on where the window starts.
        first = lo - (lo - part * PARTITION_SIZE) % TILE_SIZE
        for start in range(first, hi, TILE_SIZE):
            tokens = start + tl.arange(0, TILE_SIZE)
            ok = (tokens >= lo) & (tokens < hi)
            blocks = tl.load(tables_ptr + seq * stride_tb + tokens // BLOCK_SIZE, mask=ok, other=0)
            slots = blocks.to(tl.int64) * BLOCK_SIZE + tokens % BLOCK_SIZE
            k = tl.load(key_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                        mask=ok[:, None] & d_ok[None, :], other=0.0)   # [T, D]
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [G, T], log2 units
            scores = tl.where(ok[None, :], scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            rescale = tl.exp2(row_max - new_max)
            weights = tl.exp2(scores - new_max[:, None])
            row_sum = row_sum * rescale + tl.sum(weights, 1)
            v = tl.load(value_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                        mask=ok[:, None] & d_ok[None, :], other=0.0)   # [T, D]
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            row_max = new_max
        out = acc / row_sum[:, None]  # a live partition has at least one key: row_sum > 0
        store_mask = head_ok[:, None] & d_ok[None, :]
        if SPLIT:
            lse = row_max + tl.log2(row_sum)
            tl.store(part_lse_ptr + seq * stride_pb + heads * stride_ph + part * stride_ps, lse, mask=head_ok)
            tl.store(part_out_ptr + (seq * stride_pb + heads[:, None] * stride_ph + part * stride_ps) * BLOCK_D
                     + d[None, :], out, mask=store_mask)
        else:
            tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=store_mask)

    @triton.jit
    def _merge_kernel(part_out_ptr, part_lse_ptr, out_ptr, positions_ptr, window,
                      stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PARTITION_SIZE: tl.constexpr,
                      CHUNK: tl.constexpr, WINDOWED: tl.constexpr):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        length = tl.load(positions_ptr + seq).to(tl.int32) + 1
        last = tl.cdiv(length, PARTITION_SIZE)                       # the row's partitions: first .. last - 1
        first = 0
        if WINDOWED:
            first = tl.maximum(length - window, 0) // PARTITION_SIZE
        d = tl.arange(0, BLOCK_D)
        base = seq * stride_pb + head * stride_ph
        top = float("-inf")
        total = 0.0
        acc = tl.zeros([BLOCK_D], tl.float32)
        # CHUNK partitions at a time, in partition order (a 128k context has 1024 of them), merged online.
        # Chunks stay aligned to partition 0 whatever the window, and the masked slots of a chunk weigh
        # exactly 0 (lse -inf), so a row's bits depend on its own partitions only; the workspace of the
        # others is never read (their programs wrote nothing there).
        for start in range(first - first % CHUNK, last, CHUNK):
            p = start + tl.arange(0, CHUNK)
            mine = (p >= first) & (p < last)
            lse = tl.load(part_lse_ptr + base + p * stride_ps, mask=mine, other=float("-inf"))  # [C]
            new_top = tl.maximum(top, tl.max(lse, 0))
            seen = new_top != float("-inf")
            shift = tl.where(seen, new_top, 0.0)  # never -inf - -inf
            rescale = tl.where(seen, tl.exp2(top - shift), 1.0)
            weights = tl.exp2(lse - shift)
            parts = tl.load(part_out_ptr + (base + p[:, None] * stride_ps) * BLOCK_D + d[None, :],
                            mask=mine[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # [C, D]
            acc = acc * rescale + tl.sum(parts * weights[:, None], 0)
            total = total * rescale + tl.sum(weights, 0)
            top = new_top
        tl.store(out_ptr + seq * stride_ob + head * stride_oh + d, (acc / total).to(out_ptr.dtype.element_ty),
                 mask=d < HEAD_DIM)


def paged_decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, positions: torch.Tensor, block_size: int, scale: float,
                           window: int | None = None) -> torch.Tensor:
    """q [B, H, D], one query per sequence at `positions` [B]; caches [slots, Hkv, D]; block_tables
    [B, max_blocks] (rows past a sequence's length are never read) -> [B, H, D] in q's dtype: softmax(q . k
    * scale) @ v over the keys position - window < j <= position (all j <= position without a window).
    The grid depends on shapes only (no host sync), so a captured graph can replay it."""
    if triton is None:
        raise RuntimeError(f"Triton paged decode attention: {unavailable_reason()}")
    batch, heads, dim = q.shape
    kv_heads = key_cache.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} KV heads")
    if key_cache.stride(2) != 1 or value_cache.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("the caches' and the queries' head dimension must be contiguous")
    group = heads // kv_heads
    # tl.dot wants every dimension at least 16; padded query heads and features are masked off.
    block_g = max(16, triton.next_power_of_2(group))
    block_d = max(16, triton.next_power_of_2(dim))
    parts = max(1, math.ceil(block_tables.shape[1] * block_size / PARTITION))
    out = torch.empty_like(q)
    split = parts > 1
    if split:
        part_out, part_lse = _workspace(batch, heads, parts, block_d, q.device)
    else:  # not read: the single partition writes the output itself
        part_out = part_lse = out
    # fp32 caches: a true float32 product (Triton's default for float32 inputs is TF32 on a GPU).
    precision = "ieee" if key_cache.dtype == torch.float32 else "tf32"
    _partition_kernel[(batch, kv_heads, parts)](
        q, key_cache, value_cache, block_tables, positions, out, part_out, part_lse,
        scale * _LOG2E, window or 0,
        q.stride(0), q.stride(1), key_cache.stride(0), key_cache.stride(1),
        value_cache.stride(0), value_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1),
        heads * parts if split else 0, parts if split else 0, 1 if split else 0,
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=dim, BLOCK_D=block_d, BLOCK_SIZE=block_size,
        PARTITION_SIZE=PARTITION, TILE_SIZE=TILE, WINDOWED=window is not None, SPLIT=split,
        PRECISION=precision)
    if split:
        _merge_kernel[(batch, heads)](
            part_out, part_lse, out, positions, window or 0, heads * parts, parts, 1, out.stride(0), out.stride(1),
            HEAD_DIM=dim, BLOCK_D=block_d, PARTITION_SIZE=PARTITION, CHUNK=MERGE_CHUNK, WINDOWED=window is not None)
    return out


def _workspace(batch: int, heads: int, parts: int, block_d: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each partition's normalized output [B, H, parts, BLOCK_D] and log-sum-exp [B, H, parts], float32;
    left uninitialized: a row's partitions past its length are neither written nor read."""
    return (torch.empty((batch, heads, parts, block_d), dtype=torch.float32, device=device),
            torch.empty((batch, heads, parts), dtype=torch.float32, device=device))
