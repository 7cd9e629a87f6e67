"""A Llama-family (or Gemma) decoder layer of a serving step in one native call (engine/kernels/cpu/decoder_layer.cpp),
with the final norm and the RoPE tables it reads.

The residual stream stays in fp32; every projection is our quantized GEMM (int8 activations, engine/kernels/cpu/
qgemm.py) and attention our paged op (engine/kernels/cpu/paged_attention.py), with the elementwise work between
them (norms, bias, RoPE, the cache write, SiLU or GELU, Gemma's norms after attention and MLP) in the same
call. Every row's arithmetic is fixed by that row
alone (the order is written out in decoder_layer.cpp), so a token's output is the same bits whatever else is
in the step, however its prompt was chunked, with any thread count, on any SIMD path.

`native_available()` (engine/kernels/cpu/qgemm.py) first; paths as there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels.cpu.qgemm import FAKE_REGISTRARS, _ops, _path_id

SILU, GELU_TANH = 0, 1  # the MLP's activations, as decoder_layer.cpp numbers them
ACTIVATIONS = {"silu": SILU, "gelu_pytorch_tanh": GELU_TANH}  # by HF's hidden_act names


@dataclass(frozen=True)
class LayerWeights:
    """One layer's operands, prepared once at load: fp32 norms and bias, packed projections.

    tensors: attn_norm, qkv, qkv_bias (or empty), q_norm (or empty), k_norm (or empty), o, ffn_norm,
    gate_up (gate rows, then up rows), down, post_attn_norm and post_ffn_norm (Gemma's sandwich norms, or
    both empty). qtypes: the ggml types of qkv, o, gate_up, down. shape: heads, kv_heads, head_dim,
    intermediate size. activation: SILU (SwiGLU) or GELU_TANH (GeGLU)."""
    tensors: tuple[torch.Tensor, ...]
    qtypes: tuple[int, int, int, int]
    shape: tuple[int, int, int, int]
    activation: int = 0


def decoder_layer(x: torch.Tensor, weights: LayerWeights, cos: torch.Tensor, sin: torch.Tensor,
                  key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  block_tables: torch.Tensor, token_sequence: torch.Tensor, positions: torch.Tensor,
                  block_size: int, sliding_window: int | None, scale: float, eps: float,
                  path: str | None = None) -> None:
    """x [N, D] float32, updated in place to the layer's output; the step's keys and values are written
    to the caches ([slots, Hkv, hd], bfloat16 or float32) at slot_mapping [N]. cos, sin [N, hd/2] float32
    from `rope_tables`; block_tables, token_sequence, positions as engine/kernels/cpu/paged_attention.py takes them."""
    _ops().decoder_layer.default(x, list(weights.tensors), list(weights.qtypes), list(weights.shape), cos, sin,
                                 key_cache, value_cache, slot_mapping, block_tables, token_sequence, positions,
                                 block_size, sliding_window, float(scale), float(eps), weights.activation,
                                 _path_id(path))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [N, D] float32 normed per row with weight [D] float32, in the layer's fixed order."""
    out: torch.Tensor = _ops().rms_norm.default(x, weight, float(eps))
    return out


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int64 [N], inv_freq float32 [hd/2] -> cos, sin float32 [N, hd/2]."""
    cos, sin = _ops().rope_tables.default(positions, inv_freq)
    return cos, sin


def _register_fakes() -> None:
    @torch.library.register_fake("workbench::decoder_layer")
    def _layer_fake(x: torch.Tensor, weights: list[torch.Tensor], qtypes: list[int], shape: list[int],
                    cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, block_tables: torch.Tensor, token_sequence: torch.Tensor,
                    positions: torch.Tensor, block_size: int, sliding_window: int | None, scale: float, eps: float,
                    activation: int = 0, path: int = -1) -> None:
        return None

    @torch.library.register_fake("workbench::rms_norm")
    def _norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("workbench::rope_tables")
    def _rope_fake(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (positions.shape[0], inv_freq.shape[0])
        return inv_freq.new_empty(shape), inv_freq.new_empty(shape)


FAKE_REGISTRARS.append(_register_fakes)
