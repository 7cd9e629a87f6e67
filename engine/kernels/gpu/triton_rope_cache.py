"""RoPE on a step's queries and keys, and the keys and values written to the paged KV cache, in one Triton
kernel: what engine/model/attention.py does as `apply_rope` over the q and k heads, then two `index_copy_`
into the caches by slot.

One program per (token, head) of the fused projection's q, k and v heads; a head of D features is
rotated as engine/model/rope.py's `apply_rope` does (half rotation, HF's `rotate_half`):

    out[i] = round(x[i] * cos[i]) + round(x[(i + D/2) % D] * signed_sin[i])   (then rounded once more)

with the same cos and signed-sin tables `rope_cos_sin` builds for the step (signs folded into the sin's
first half), each product rounded to the activations' dtype as torch's ops are (no-ops in float32).
The interleaved pairing (2i, 2i + 1) has no variant here: the loader reorders GGUF's q/k rows into HF's
halves (engine/loading/gguf_model.py), so the model has one kind of RoPE. Query heads go to a new
tensor; key heads (rotated) and value heads (as they are) go to the cache rows of their token's slot,
laid out as engine/scheduler/kv_cache.py allocates them: [slots, Hkv, D] per layer. Runs on CUDA, and
on the CPU under TRITON_INTERPRET=1 (tests only).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path serves where Triton is missing
    triton = None


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _rope_cache_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slots_ptr, q_out_ptr, key_cache_ptr,
                           value_cache_ptr,
                           stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_cn, stride_sn,
                           stride_on, stride_oh, stride_ks, stride_kch, stride_vs, stride_vch,
                           HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
        token = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)                      # 0 .. HEADS - 1 queries, then the KV heads
        d = tl.arange(0, BLOCK_D)
        ok = d < HEAD_DIM
        partner = (d + HEAD_DIM // 2) % HEAD_DIM     # roll(x, D/2): the other half's feature
        cos = tl.load(cos_ptr + token * stride_cn + d, mask=ok, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + token * stride_sn + d, mask=ok, other=0.0).to(tl.float32)
        dtype = q_out_ptr.dtype.element_ty
        if head < HEADS:
            row = q_ptr + token * stride_qn + head * stride_qh
            x = tl.load(row + d, mask=ok, other=0.0).to(tl.float32)
            x_partner = tl.load(row + partner, mask=ok, other=0.0).to(tl.float32)
            rotated = (x * cos).to(dtype).to(tl.float32) + (x_partner * sin).to(dtype).to(tl.float32)
            tl.store(q_out_ptr + token * stride_on + head * stride_oh + d, rotated.to(dtype), mask=ok)
        else:
            kv_head = head - HEADS
            slot = tl.load(slots_ptr + token).to(tl.int64)
            row = k_ptr + token * stride_kn + kv_head * stride_kh
            x = tl.load(row + d, mask=ok, other=0.0).to(tl.float32)
            x_partner = tl.load(row + partner, mask=ok, other=0.0).to(tl.float32)
            rotated = (x * cos).to(dtype).to(tl.float32) + (x_partner * sin).to(dtype).to(tl.float32)
            tl.store(key_cache_ptr + slot * stride_ks + kv_head * stride_kch + d,
                     rotated.to(key_cache_ptr.dtype.element_ty), mask=ok)
            value = tl.load(v_ptr + token * stride_vn + kv_head * stride_vh + d, mask=ok, other=0.0)
            tl.store(value_cache_ptr + slot * stride_vs + kv_head * stride_vch + d,
                     value.to(value_cache_ptr.dtype.element_ty), mask=ok)


def rope_and_cache_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                         signed_sin: torch.Tensor, slot_mapping: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor) -> torch.Tensor:
    """q [N, H, D], k and v [N, Hkv, D] (views into the fused projection are fine), the step's tables from
    `rope_cos_sin` ([N, 1, D] or [N, D]), slot_mapping [N], caches [slots, Hkv, D] -> the rotated queries
    [N, H, D]; the rotated keys and the values are written to the caches at each token's slot."""
    if triton is None:
        raise RuntimeError("Triton RoPE + cache write: the triton package is not installed")
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    if k.shape != (tokens, kv_heads, dim) or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} do not match")
    if dim % 2:
        raise ValueError(f"RoPE rotates halves of the head: {dim} features do not halve")
    if key_cache.shape[1:] != (kv_heads, dim) or value_cache.shape != key_cache.shape:
        raise ValueError(f"caches {tuple(key_cache.shape)} do not hold {kv_heads} heads of {dim}")
    cos, signed_sin = cos.reshape(tokens, dim), signed_sin.reshape(tokens, dim)
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, signed_sin, key_cache, value_cache)):
        raise ValueError("the head dimension of q, k, v, the tables and the caches must be contiguous")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if tokens:
        _rope_cache_kernel[(tokens, heads + kv_heads)](
            q, k, v, cos, signed_sin, slot_mapping, out, key_cache, value_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
            signed_sin.stride(0), out.stride(0), out.stride(1), key_cache.stride(0), key_cache.stride(1),
            value_cache.stride(0), value_cache.stride(1),
            HEADS=heads, HEAD_DIM=dim, BLOCK_D=triton.next_power_of_2(dim))
    return out
