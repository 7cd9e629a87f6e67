"""Rotary position embeddings (RoPE) for the Llama family, with llama3 and linear frequency scaling
and the per-frequency factors GGUF files store.

The inverse frequencies are computed once per model; `rope_cos_sin` turns positions into the cos/sin
tables for one forward. Arithmetic follows HF transformers step for step (fp32 tables, cast to the
activation dtype last) because parity with it is a requirement, not an accident.
"""

from __future__ import annotations

import math

import torch

from engine.model.config import ModelConfig


def rope_inverse_frequencies(config: ModelConfig, sliding: bool = False) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies on the CPU (also under a meta-device build), scaled as
    config.rope_scaling or config.rope_freq_factors say; `sliding`: those of the sliding-window layers
    of a model that gives them a base of their own (Gemma 3), unscaled."""
    dim = config.head_dim
    base = config.rope_local_theta if sliding and config.rope_local_theta is not None else config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    if sliding and config.rope_local_theta is not None:
        return inv_freq
    if config.rope_freq_factors is not None:
        return inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32, device="cpu")
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
    """cos and signed-sin tables of shape positions.shape + [1, head_dim], in `dtype`, ready to broadcast
    over heads. The sin table's first half is negated so that `apply_rope` needs no negation."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [..., D/2]
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    return torch.cat((cos, cos), dim=-1).unsqueeze(-2), torch.cat((-sin, sin), dim=-1).unsqueeze(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., H, D] by the tables from `rope_cos_sin`: HF's x*cos + rotate_half(x)*sin, where
    rotate_half(x) = (-x2, x1) equals roll(x, D/2) times the signs folded into signed_sin."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin
