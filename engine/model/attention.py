"""Grouped-query self-attention over the paged KV cache, and the metadata that drives it.

The batch is a flat run of tokens from several sequences (prefills and decodes mixed). Attention never
looks up global state: `AttentionMetadata` says, per token, its position and cache slot, and per
sequence, where its queries start, how long its history is and which blocks hold it. The metadata is
built once per step and shared by every layer, so the per-layer work is write-slots, gather, attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from engine.host_copy import device_tensor
from engine.model.config import ModelConfig
from engine.model.layers import Linear, fuse_projections
from engine.model.rope import apply_rope


@dataclass(frozen=True)
class AttentionMetadata:
    positions: torch.Tensor      # [N] position of each flat token
    slot_mapping: torch.Tensor   # [N] cache slot each token's key/value is written to
    block_tables: torch.Tensor   # [B, max_blocks] each sequence's blocks, padded with its last (masked)
    query_index: torch.Tensor    # [B, Tq] flat index of each sequence's i-th query (padding points at 0)
    valid_queries: torch.Tensor  # [N] indices into the flattened [B * Tq] padded queries that are real
    attn_mask: torch.Tensor      # [B, 1, Tq, max_blocks * block_size] additive: 0 may attend, -inf not
    last_token_index: torch.Tensor  # [B] flat index of each sequence's last token (whose logits are sampled)
    decode_only: bool               # every sequence feeds exactly one token
    block_size: int

    @classmethod
    def build(cls, *, block_size: int, block_tables: list[list[int]], cached_lens: list[int],
              query_lens: list[int], sliding_window: int | None = None,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "AttentionMetadata":
        """Metadata for one step. Sequence b already has cached_lens[b] tokens in its blocks and feeds
        query_lens[b] new tokens (its whole prompt for a prefill, 1 for a decode)."""
        if not (len(block_tables) == len(cached_lens) == len(query_lens)) or not query_lens:
            raise ValueError("block_tables, cached_lens and query_lens must be non-empty and of one length")
        for b, table in enumerate(block_tables):
            if len(table) * block_size < cached_lens[b] + query_lens[b]:
                raise ValueError(f"sequence {b}: {cached_lens[b] + query_lens[b]} tokens do not fit its "
                                 f"{len(table)} blocks")
        # Plain Python lists first, one tensor per field at the end: this runs every step, and many
        # small tensor operations cost more than the arithmetic.
        max_q, max_blocks = max(query_lens), max(len(t) for t in block_tables)
        positions: list[int] = []
        slots: list[int] = []
        query_index: list[list[int]] = []
        query_pos: list[list[int]] = []
        last: list[int] = []
        flat = 0
        for table, cached, count in zip(block_tables, cached_lens, query_lens):
            new = range(cached, cached + count)
            positions.extend(new)
            slots.extend(table[p // block_size] * block_size + p % block_size for p in new)
            query_index.append(list(range(flat, flat + count)) + [0] * (max_q - count))
            query_pos.append(list(new) + [-1] * (max_q - count))
            flat += count
            last.append(flat - 1)
        # Padded with the sequence's own last block: masked either way, but a sequence never reads
        # another sequence's memory, whatever state it is in.
        padded_tables = [t + t[-1:] * (max_blocks - len(t)) for t in block_tables]
        valid_queries = [b * max_q + i for b, count in enumerate(query_lens) for i in range(count)]
        device = torch.device(device)

        # Every field from host lists in one pinned, non-blocking copy each (engine/host_copy.py); the
        # mask, the largest, is built on the device from the query positions.
        query_pos_t = device_tensor(query_pos, device)[:, :, None]                  # [B, Tq, 1]
        key_pos = torch.arange(max_blocks * block_size, device=device)[None, None]  # [1, 1, Tk]
        allowed = key_pos <= query_pos_t  # causal; also excludes keys past the sequence's length
        if sliding_window is not None:
            allowed &= key_pos > query_pos_t - sliding_window
        valid = query_pos_t[:, :, 0] >= 0
        # Padding rows attend key 0 only, so softmax never sees an all-masked row (NaN); they are dropped.
        allowed |= (~valid[:, :, None]) & (key_pos == 0)
        # Additive, in the activation dtype (SDPA's fused kernels want the bias to match the queries),
        # made once per step: a boolean mask would be converted again by every layer.
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf")).unsqueeze(1)
        return cls(
            positions=device_tensor(positions, device),
            slot_mapping=device_tensor(slots, device),
            block_tables=device_tensor(padded_tables, device),
            query_index=device_tensor(query_index, device),
            valid_queries=device_tensor(valid_queries, device),
            attn_mask=mask,
            last_token_index=device_tensor(last, device),
            decode_only=max_q == 1,
            block_size=block_size,
        )


def decode_metadata(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int,
                    sliding_window: int | None, dtype: torch.dtype) -> AttentionMetadata:
    """Metadata for a batch of one-token decodes, from device tensors by tensor operations only: what
    a captured graph can recompute on replay from its static buffers, with no host values."""
    batch, max_blocks = block_tables.shape
    rows = torch.arange(batch, device=positions.device)
    slots = block_tables[rows, positions // block_size] * block_size + positions % block_size
    key_pos = torch.arange(max_blocks * block_size, device=positions.device)[None, :]
    allowed = key_pos <= positions[:, None]
    if sliding_window is not None:
        allowed &= key_pos > positions[:, None] - sliding_window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device).masked_fill_(~allowed, float("-inf"))
    return AttentionMetadata(positions=positions, slot_mapping=slots, block_tables=block_tables,
                             query_index=rows[:, None], valid_queries=rows, attn_mask=mask[:, None, None, :],
                             last_token_index=rows, decode_only=True, block_size=block_size)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.sliding_window = config.sliding_window
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden, bias=config.attention_output_bias)
        self._qkv: Callable[[torch.Tensor], torch.Tensor] | None = None

    def fuse_for_inference(self) -> None:
        self._qkv = fuse_projections(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                metadata: AttentionMetadata | None = None,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x is [N, hidden] with metadata and cache (serving), or [B, T, hidden] without (training:
        plain causal attention over the given tokens, nothing cached)."""
        lead = x.shape[:-1]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        if self._qkv is not None:
            qkv = self._qkv(x).view(*lead, heads + 2 * kv_heads, dim)
        else:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1).view(*lead, -1, dim)
        # RoPE once over the query and key heads together.
        qk = apply_rope(qkv[..., : heads + kv_heads, :], cos, sin)
        q, k, v = qk[..., :heads, :], qk[..., heads:, :], qkv[..., heads + kv_heads:, :]

        if metadata is None:
            out = self._causal(q, k, v)  # [B, T, H, D]
        else:
            assert cache is not None, "serving attention needs the layer's KV cache"
            out = self._paged(q, k, v, metadata, cache)  # [N, H, D]
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        mask = None
        if self.sliding_window is not None and q.shape[2] > self.sliding_window:
            t = torch.arange(q.shape[2], device=q.device)
            mask = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - self.sliding_window)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return out.transpose(1, 2)

    @staticmethod
    def _gather_blocks(cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """[slots, Hkv, D] cache -> [B, Hkv, max_blocks * block_size, D], each sequence's blocks in order."""
        batch, max_blocks = metadata.block_tables.shape
        by_block = cache.view(-1, metadata.block_size, *cache.shape[1:])  # [blocks, block_size, Hkv, D]
        gathered = by_block.index_select(0, metadata.block_tables.view(-1))
        return gathered.view(batch, max_blocks * metadata.block_size, *cache.shape[1:]).transpose(1, 2)

    def _paged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               metadata: AttentionMetadata, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        key_cache, value_cache = cache  # [slots, Hkv, D]
        key_cache.index_copy_(0, metadata.slot_mapping, k)
        value_cache.index_copy_(0, metadata.slot_mapping, v)
        keys, values = self._gather_blocks(key_cache, metadata), self._gather_blocks(value_cache, metadata)
        gqa = self.num_kv_heads != self.num_heads
        if metadata.decode_only and q.dtype != torch.float32 and q.device.type == "cpu":
            return self._decode_attention_float32_math(q, keys, values, metadata.attn_mask)
        if metadata.decode_only:  # one query per sequence: no padding to add or strip
            out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=metadata.attn_mask,
                                                 enable_gqa=gqa)
            return out.squeeze(2)                                 # [B, H, D]
        queries = q[metadata.query_index].transpose(1, 2)        # [B, H, Tq, D]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=metadata.attn_mask, enable_gqa=gqa)
        out = out.transpose(1, 2).flatten(0, 1)                   # [B * Tq, H, D]
        # An index list built on the host: a boolean mask here would sync with the device every layer.
        return out.index_select(0, metadata.valid_queries)       # [N, H, D] in flat token order

    def _decode_attention_float32_math(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                               mask: torch.Tensor) -> torch.Tensor:
        """One query per sequence in bfloat16/float16 on the CPU: scores, softmax and the weighted sum in
        float32, rounded to the activation dtype once at the end, as SDPA's own kernel does (the same
        error against a float32 reference). Measured 2.5-6x faster than SDPA's CPU kernel for one query in
        bf16 (batch 1 x 64 keys: 20 vs 51 us; batch 8 x 256 keys: 243 vs 1600 us; a whole quantized bf16
        decode step at batch 8: 45 -> 28 ms, 1 thread): that kernel's fixed cost per call dominates there."""
        batch, kv_heads, keys_len, dim = keys.shape
        group = self.num_heads // kv_heads
        queries = q.reshape(batch * kv_heads, group, dim).float()                 # [B*Hkv, g, D]
        bias = mask.reshape(batch, 1, 1, keys_len).expand(batch, kv_heads, 1, keys_len)
        scores = torch.baddbmm(bias.reshape(batch * kv_heads, 1, keys_len).float(), queries,
                               keys.reshape(batch * kv_heads, keys_len, dim).float().transpose(1, 2),
                               alpha=dim ** -0.5)                                 # [B*Hkv, g, T]
        weights = torch.softmax(scores, dim=-1)
        out = torch.bmm(weights, values.reshape(batch * kv_heads, keys_len, dim).float())  # [B*Hkv, g, D]
        return out.to(q.dtype).view(batch, self.num_heads, dim)                  # [B, H, D]
