"""ModelConfig: the architecture hyper-parameters of a Llama-family checkpoint, read from HF config.json.

One dataclass for llama, mistral and qwen2: they differ only in a few switches (q/k/v bias, sliding
window, RoPE scaling). Values are checked in `__post_init__` so a malformed config fails at load time
with a message naming the field, not deep inside a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_SCALING = ("llama3", "linear", "default")
_ROPE_SCALING_KEYS = {"llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                      "linear": ("factor",), "default": ()}


class ConfigError(ValueError):
    """A config.json that this engine cannot run, with the reason."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False         # q/k/v projections
    attention_output_bias: bool = False  # o projection
    mlp_bias: bool = False
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config field {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, dict):
                raise ConfigError(f"rope_scaling must be an object, got {self.rope_scaling!r}")
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in SUPPORTED_ROPE_SCALING:
                raise ConfigError(
                    f"unsupported rope_scaling type {kind!r}; supported: {', '.join(SUPPORTED_ROPE_SCALING)}"
                )
            missing = [k for k in _ROPE_SCALING_KEYS[kind] if not isinstance(self.rope_scaling.get(k), (int, float))]
            if missing:
                raise ConfigError(f"rope_scaling of type {kind} needs number(s): {', '.join(missing)}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ConfigError(f"sliding_window must be a positive integer or null, got {self.sliding_window!r}")

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Build from the dict in an HF config.json, applying each model_type's HF defaults."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ConfigError(f"config.json lacks required field(s): {', '.join(missing)}")
        heads = raw["num_attention_heads"]
        if not isinstance(heads, int) or heads <= 0:
            raise ConfigError(f"config field num_attention_heads must be a positive integer, got {heads!r}")
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        # HF keeps RoPE settings either flat (rope_theta, rope_scaling) or, from transformers 5 on,
        # in one rope_parameters dict; both spellings describe the same thing.
        rope_params = raw.get("rope_parameters") or {}
        rope_theta = raw.get("rope_theta") or rope_params.get("rope_theta") or 10000.0
        rope_scaling = raw.get("rope_scaling")
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if isinstance(rope_scaling, dict) and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
            rope_scaling = None
        sliding_window = raw.get("sliding_window")
        if model_type == "qwen2" and not raw.get("use_sliding_window", False):
            sliding_window = None
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v bias and no o bias; Llama's attention_bias covers q/k/v and o;
            # Mistral has none.
            attention_bias=True if model_type == "qwen2" else bool(raw.get("attention_bias", False)),
            attention_output_bias=model_type == "llama" and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
            sliding_window=sliding_window,
            eos_token_ids=eos_ids,
        )
