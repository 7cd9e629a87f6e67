"""Rotary position embeddings (RoPE) for the Llama family, with llama3 and linear frequency scaling.

The inverse frequencies are computed once per model; `rope_cos_sin` turns positions into the cos/sin
tables for one forward. Arithmetic follows HF transformers step for step (fp32 tables, cast to the
activation dtype last) because parity with it is a requirement, not an accident.
"""

from __future__ import annotations

import math

import torch

from engine.model.config import ModelConfig


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies on the CPU (also under a meta-device build), scaled as
    config.rope_scaling says."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1's scheme: long wavelengths are divided by `factor`, short ones kept, and the band in
    # between blends smoothly, so the model keeps local detail while reaching a longer context.
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape positions.shape + [head_dim], in `dtype`."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, H, D] by the tables cos/sin [..., T, D] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
