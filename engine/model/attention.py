"""Grouped-query self-attention over the paged KV cache.

The batch is a flat run of tokens from several sequences (prefills and decodes mixed). Attention never
looks up global state: `AttentionMetadata` (engine/model/attention_metadata.py) says, per token, its
position, cache slot and sequence. The metadata is built once per step and shared by every layer, so
the per-layer work is write-slots, then attend.

On the CPU with the native kernels (engine/kernels/cpu/paged_attention.py, where `native_available()`), every
token of the step, decode or prompt chunk, goes through one op that reads its own sequence's keys
0 .. p from the cache in an order fixed by those keys alone: a row's output is the same bits alone or
beside any others, whole or chunked at any boundary, in a captured graph's replay or eagerly. Elsewhere
(a GPU, or no compiler) the step is split into its decodes, attended together as in a step of decodes
only, and its prefills, each attended alone over its own keys by SDPA; there a prefill row's last bits
can change with chunking. The decodes go, on CUDA where Triton imports, through the paged kernel
(engine/kernels/gpu/triton_paged_decode.py: the cache read in place, a row's bits independent of the others);
otherwise through the torch path: their blocks gathered, padded to the group's longest and masked, so a
row's last bits can change with the others' lengths. A step of decodes only on the Triton backend also
rotates q and k and writes the cache in one kernel (engine/kernels/gpu/triton_rope_cache.py).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from engine.kernels import cpu as cpu_kernels
from engine.model.attention_metadata import AttentionMetadata, DecodeGroup, PrefillGroup
from engine.model.config import ModelConfig
from engine.model.layers import Linear, RMSNorm, fuse_projections
from engine.model.rope import apply_rope


DECODE_BACKENDS = ("torch", "triton")


def native_attention(device: torch.device) -> bool:
    """Whether serving attention on `device` goes through the native CPU op."""
    return device.type == "cpu" and cpu_kernels.native_available()


def decode_attention_backend(device: torch.device, triton_allowed: bool = True) -> tuple[str, str]:
    """(backend, why) for the decodes' attention on `device`: "triton" (the paged kernel) on CUDA where
    triton imports, unless `triton_allowed` is off (EngineConfig.triton_attention); "torch" otherwise."""
    if device.type != "cuda":
        return "torch", f"the Triton kernel runs on CUDA only, not {device.type}"
    if not triton_allowed:
        return "torch", "ARC_TRITON_ATTENTION is off"
    from engine.kernels.gpu import triton_paged_decode  # imports triton: only where it can serve

    if not triton_paged_decode.available():
        return "torch", str(triton_paged_decode.unavailable_reason())
    return "triton", "CUDA and triton present"


class Attention(nn.Module):
    # How decodes attend (DECODE_BACKENDS), set for every layer by LlamaForCausalLM.set_decode_attention.
    decode_backend = "torch"

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.sliding_window = config.layer_window(index)
        self.scale = config.attention_scale
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden, bias=config.attention_output_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
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
        qk = qkv[..., : heads + kv_heads, :]
        on_triton = metadata is not None and cache is not None and self.decode_backend == "triton"
        if self.qk_norm:  # each head normed over its own features, before RoPE (Qwen3, Gemma 3)
            q_part, k_part = qk[..., :heads, :], qk[..., heads:, :]
            qk = torch.cat([self.q_norm.triton_forward(q_part), self.k_norm.triton_forward(k_part)] if on_triton
                           else [self.q_norm(q_part), self.k_norm(k_part)], dim=-2)
        if on_triton:
            # A serving step on the Triton backend, prefills beside the decodes or not (so that a decode's
            # bits never depend on them): RoPE and the cache write in one kernel, then the decodes by the
            # paged decode kernel; the same arithmetic as below, fewer passes over q, k and v.
            from engine.kernels.gpu.triton_rope_cache import rope_and_cache_write

            assert metadata is not None and cache is not None  # on_triton says so; for the type checker
            q = rope_and_cache_write(qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:], cos, sin,
                                     metadata.slot_mapping, *cache)                 # [N, H, D]
            out = self._attend_cached(q, None, metadata, cache)
            return self.o_proj(out.reshape(*lead, heads * dim))
        # RoPE once over the query and key heads together.
        qk = apply_rope(qk, cos, sin)
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
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return out.transpose(1, 2)

    @staticmethod
    def _gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
        """[slots, Hkv, D] cache -> [B, Hkv, blocks * block_size, D], each row's blocks ([B, blocks]) in order."""
        batch, blocks = block_tables.shape
        by_block = cache.view(-1, block_size, *cache.shape[1:])  # [all blocks, block_size, Hkv, D]
        gathered = by_block.index_select(0, block_tables.view(-1))
        return gathered.view(batch, blocks * block_size, *cache.shape[1:]).transpose(1, 2)

    def _paged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               metadata: AttentionMetadata, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        key_cache, value_cache = cache  # [slots, Hkv, D]
        key_cache.index_copy_(0, metadata.slot_mapping, k)
        value_cache.index_copy_(0, metadata.slot_mapping, v)
        if metadata.block_tables is not None and metadata.token_sequence is not None and native_attention(q.device):
            # The step's keys are in the cache now: every row reads its own through its block table.
            return cpu_kernels.paged_attention(q, key_cache, value_cache, metadata.block_tables,
                                               metadata.token_sequence, metadata.positions, metadata.block_size,
                                               self.sliding_window, self.scale)  # [N, H, D]
        return self._attend_cached(q, (k, v), metadata, cache)

    def _attend_cached(self, q: torch.Tensor, step_kv: tuple[torch.Tensor, torch.Tensor] | None,
                       metadata: AttentionMetadata, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """[N, H, D] queries of a step whose keys and values are in the cache now -> [N, H, D]. `step_kv`:
        the step's own keys and values, which a prefill with nothing cached before it reads; None: it
        reads them back from the cache, by slot."""
        slots = metadata.slot_mapping
        metadata = metadata.for_window(self.sliding_window)
        decodes = metadata.decodes
        if metadata.decode_only:
            assert decodes is not None  # a step has at least one sequence
            return self._decode(q, cache, decodes, metadata.block_size)  # [N, H, D]: token b is decode b
        out = q.new_empty(q.shape)                                        # [N, H, D] in flat token order
        if decodes is not None:
            assert decodes.token_index is not None  # set whenever prefills share the step
            rows = self._decode(q.index_select(0, decodes.token_index), cache, decodes, metadata.block_size)
            out.index_copy_(0, decodes.token_index, rows)
        if step_kv is None and any(prefill.block_table is None for prefill in metadata.prefills):
            step_kv = cache[0].index_select(0, slots), cache[1].index_select(0, slots)  # [N, Hkv, D] each
        for prefill in metadata.prefills:
            out[prefill.start: prefill.stop] = self._prefill(q, step_kv, cache, prefill, metadata.block_size)
        return out

    def _decode(self, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], decodes: DecodeGroup,
                block_size: int) -> torch.Tensor:
        """[Bd, H, D] queries, one per sequence -> [Bd, H, D]: the torch path's one path every decode takes, in
        a step of decodes only (and its captured graph) or beside prefills, so its result does not depend
        on them (on the torch path it still depends, in the last bits, on the longest decode beside it: keys are
        padded; not with the Triton kernel)."""
        if self.decode_backend == "triton":
            from engine.kernels.gpu.triton_paged_decode import paged_decode_attention

            return paged_decode_attention(q, cache[0], cache[1], decodes.block_tables, decodes.positions, block_size,
                                          self.scale, self.sliding_window)
        keys, values = (self._gather_blocks(c, decodes.block_tables, block_size) for c in cache)
        if q.device.type == "cpu":
            return self._decode_attention_float32_math(q, keys, values, decodes.attn_mask)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=decodes.attn_mask,
                                             scale=self.scale, enable_gqa=self.num_kv_heads != self.num_heads)
        return out.squeeze(2)

    def _prefill(self, q: torch.Tensor, step_kv: tuple[torch.Tensor, torch.Tensor] | None,
                 cache: tuple[torch.Tensor, torch.Tensor], prefill: PrefillGroup, block_size: int) -> torch.Tensor:
        """One prefill's queries over its own keys only -> [q, H, D]: nothing padded, nobody else's keys."""
        queries = q[prefill.start: prefill.stop].transpose(0, 1)[None]  # [1, H, q, D]
        if prefill.block_table is None:  # nothing cached before it: its keys are this step's
            assert step_kv is not None  # _attend_cached gives them wherever such a prefill is
            keys, values = (t[prefill.start: prefill.stop].transpose(0, 1)[None] for t in step_kv)
        else:
            table = prefill.block_table[None]
            keys, values = (self._gather_blocks(c, table, block_size)[:, :, : prefill.key_len] for c in cache)
        mask: torch.Tensor | None = prefill.attn_mask  # CausalBias is a Tensor
        if mask is None and prefill.key_len > queries.shape[2]:
            # Cached keys before the queries: lower-right causal, which SDPA runs on its flash kernel where
            # it can (a mask tensor would leave GQA only the float32 math kernel). Imported here: the module
            # imports torch._dynamo (1.7 s), which the CPU's native path never needs.
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(queries.shape[2], prefill.key_len)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=mask is None,
                                             scale=self.scale, enable_gqa=self.num_kv_heads != self.num_heads)
        return out[0].transpose(0, 1)

    def _decode_attention_float32_math(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                                        mask: torch.Tensor) -> torch.Tensor:
        """One query per sequence on the CPU, in any dtype: scores, softmax and the weighted sum in float32,
        rounded to the activation dtype once at the end, as SDPA's own kernel does (the same error against
        a float32 reference). Each (sequence, KV head) is one matrix of a batched product, so a decode's
        result does not depend on its row among the decodes nor on the thread count; SDPA's float32 CPU
        kernel at two threads gave a decode a result that changed with its row (in the last bits, on a
        2-core AVX2 EPYC). Also faster for one query: in bf16, batch 1 x 64 keys 20 vs 51 us, batch 8 x 256
        keys 243 vs 1600 us, a whole quantized bf16 decode step at batch 8 45 -> 28 ms (1 thread): SDPA's
        fixed cost per call dominates there."""
        batch, kv_heads, keys_len, dim = keys.shape
        group = self.num_heads // kv_heads
        queries = q.reshape(batch * kv_heads, group, dim).float()                 # [B*Hkv, g, D]
        bias = mask.reshape(batch, 1, 1, keys_len).expand(batch, kv_heads, 1, keys_len)
        scores = torch.baddbmm(bias.reshape(batch * kv_heads, 1, keys_len).float(), queries,
                               keys.reshape(batch * kv_heads, keys_len, dim).float().transpose(1, 2),
                               alpha=self.scale)                                  # [B*Hkv, g, T]
        weights = torch.softmax(scores, dim=-1)
        out = torch.bmm(weights, values.reshape(batch * kv_heads, keys_len, dim).float())  # [B*Hkv, g, D]
        return out.to(q.dtype).view(batch, self.num_heads, dim)                  # [B, H, D]
