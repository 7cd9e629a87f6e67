"""Paged GQA attention on the CPU through the native op (engine/kernels/cpu/paged_attention.cpp): one call for
every query token of a step, decodes and prompt chunks alike.

Each query token attends its own sequence's keys 0 .. p (with a sliding window W, p - W + 1 .. p),
read from the layer's cache through its sequence's block table, in fp32 in an order fixed by those keys
alone (engine/kernels/cpu/paged_attention.h): a row's output is the same bits whoever else is in the call,
however a prompt is chunked, with any thread count, on any code path. The step's own keys and values
must be in the cache before the call.

Paths and `native_available()` as in engine/kernels/cpu/qgemm.py ("avx512" runs the AVX2 code here).
"""

from __future__ import annotations

import torch

from engine.kernels.cpu.qgemm import FAKE_REGISTRARS, _ops, _path_id


def paged_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                    token_sequence: torch.Tensor, positions: torch.Tensor, block_size: int,
                    sliding_window: int | None = None, scale: float | None = None,
                    path: str | None = None) -> torch.Tensor:
    """q [N, H, D] float32/bfloat16; key_cache, value_cache [slots, Hkv, D] (q's dtype, contiguous);
    block_tables int64 [B, W] (a row's entries past what its tokens read are never read); token_sequence
    int64 [N], each token's row of block_tables; positions int64 [N]. scale defaults to D ** -0.5.
    Returns [N, H, D] in q's dtype (bfloat16: the fp32 result rounded once)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out: torch.Tensor = _ops().paged_attention.default(q, key_cache, value_cache, block_tables, token_sequence,
                                                       positions, block_size, sliding_window, float(scale),
                                                       _path_id(path))
    return out


def _register_fake() -> None:
    @torch.library.register_fake("workbench::paged_attention")
    def _fake(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
              token_sequence: torch.Tensor, positions: torch.Tensor, block_size: int, sliding_window: int | None,
              scale: float, path: int = -1) -> torch.Tensor:
        torch._check(q.dim() == 3 and key_cache.dim() == 3, lambda: "q must be [N, H, D], the caches [slots, Hkv, D]")
        torch._check(q.shape[1] % key_cache.shape[1] == 0, lambda: "query heads must be a multiple of KV heads")
        return torch.empty_like(q, memory_format=torch.contiguous_format)


FAKE_REGISTRARS.append(_register_fake)
