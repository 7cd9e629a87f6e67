"""Grouped-query self-attention over the paged KV cache, and the metadata that drives it.

The batch is a flat run of tokens from several sequences (prefills and decodes mixed). Attention never
looks up global state: `AttentionMetadata` says, per token, its position and cache slot, and per
sequence, where its queries start, how long its history is and which blocks hold it. The metadata is
built once per step and shared by every layer, so the per-layer work is write-slots, gather, attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from engine.model.config import ModelConfig
from engine.model.rope import apply_rope


@dataclass(frozen=True)
class AttentionMetadata:
    positions: torch.Tensor      # [N] position of each flat token
    slot_mapping: torch.Tensor   # [N] cache slot each token's key/value is written to
    query_index: torch.Tensor    # [B, Tq] flat index of each sequence's i-th query (padded rows point at 0)
    query_valid: torch.Tensor    # [B, Tq] False on padding
    kv_slots: torch.Tensor       # [B, Tk] cache slot of each sequence's j-th history token (padded with 0)
    attn_mask: torch.Tensor      # [B, 1, Tq, Tk] True where query i may attend key j
    last_token_index: torch.Tensor  # [B] flat index of each sequence's last token (whose logits are sampled)

    @classmethod
    def build(cls, *, block_size: int, block_tables: list[list[int]], cached_lens: list[int],
              query_lens: list[int], sliding_window: int | None = None,
              device: torch.device | str = "cpu") -> "AttentionMetadata":
        """Metadata for one step. Sequence b already has cached_lens[b] tokens in its blocks and feeds
        query_lens[b] new tokens (its whole prompt for a prefill, 1 for a decode)."""
        if not (len(block_tables) == len(cached_lens) == len(query_lens)) or not query_lens:
            raise ValueError("block_tables, cached_lens and query_lens must be non-empty and of one length")
        batch = len(query_lens)
        max_q = max(query_lens)
        context_lens = [c + q for c, q in zip(cached_lens, query_lens)]
        max_k = max(context_lens)
        for b, table in enumerate(block_tables):
            if len(table) * block_size < context_lens[b]:
                raise ValueError(f"sequence {b}: {context_lens[b]} tokens do not fit its {len(table)} blocks")

        positions, slots = [], []
        query_index = torch.zeros(batch, max_q, dtype=torch.long)
        query_valid = torch.zeros(batch, max_q, dtype=torch.bool)
        kv_slots = torch.zeros(batch, max_k, dtype=torch.long)
        query_pos = torch.zeros(batch, max_q, dtype=torch.long)
        flat = 0
        for b, table in enumerate(block_tables):
            table_t = torch.tensor(table, dtype=torch.long)
            ks = torch.arange(context_lens[b])
            seq_slots = table_t[ks // block_size] * block_size + ks % block_size
            kv_slots[b, : context_lens[b]] = seq_slots
            new = torch.arange(cached_lens[b], context_lens[b])
            positions.append(new)
            slots.append(seq_slots[cached_lens[b]:])
            query_index[b, : query_lens[b]] = torch.arange(flat, flat + query_lens[b])
            query_valid[b, : query_lens[b]] = True
            query_pos[b, : query_lens[b]] = new
            flat += query_lens[b]

        key_pos = torch.arange(max_k)
        mask = key_pos[None, None, :] <= query_pos[:, :, None]  # causal
        if sliding_window is not None:
            mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
        # Padding rows attend key 0 only, so softmax never sees an all-masked row (NaN); they are dropped.
        mask |= (~query_valid[:, :, None]) & (key_pos[None, None, :] == 0)
        last = torch.tensor([sum(query_lens[: b + 1]) - 1 for b in range(batch)], dtype=torch.long)
        return cls(
            positions=torch.cat(positions).to(device),
            slot_mapping=torch.cat(slots).to(device),
            query_index=query_index.to(device),
            query_valid=query_valid.to(device),
            kv_slots=kv_slots.to(device),
            attn_mask=mask.unsqueeze(1).to(device),
            last_token_index=last.to(device),
        )


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.sliding_window = config.sliding_window
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=config.attention_output_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                metadata: AttentionMetadata | None = None,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x is [N, hidden] with metadata and cache (serving), or [B, T, hidden] without (training:
        plain causal attention over the given tokens, nothing cached)."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

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

    def _paged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               metadata: AttentionMetadata, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        key_cache, value_cache = cache  # [slots, Hkv, D]
        key_cache.index_copy_(0, metadata.slot_mapping, k)
        value_cache.index_copy_(0, metadata.slot_mapping, v)
        keys = key_cache[metadata.kv_slots].transpose(1, 2)      # [B, Hkv, Tk, D]
        values = value_cache[metadata.kv_slots].transpose(1, 2)  # [B, Hkv, Tk, D]
        queries = q[metadata.query_index].transpose(1, 2)        # [B, H, Tq, D]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=metadata.attn_mask,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        out = out.transpose(1, 2)[metadata.query_valid]          # [N, H, D] in flat token order
        return out
