"""ModelConfig: the architecture hyper-parameters of a Llama-family checkpoint, read from HF config.json.

One dataclass for every family (engine/model/architectures/): each is the Llama block with a few
switches (q/k/v bias, q/k norms, Gemma's norms around attention and MLP, the MLP's activation, the
embedding scale, the attention scale, sliding-window layers with a RoPE base of their own, RoPE
scaling), which from_hf_dict sets as the family's registry entry says. Values are checked in
`__post_init__` so a malformed config fails at load time with a message naming the field, not deep
inside a forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.model.architectures import registry
from engine.model.architectures.family import Bias, Family

SUPPORTED_ROPE_SCALING = ("llama3", "linear", "default")
_ROPE_SCALING_KEYS = {"llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                      "linear": ("factor",), "default": ()}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")


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
    # Each layer's kind (LAYER_TYPES); None: every layer is alike, windowed where sliding_window is set.
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None      # the RoPE base of sliding layers (None: rope_theta)
    # Per-frequency divisors of the RoPE inverse frequencies, as GGUF files store Llama 3.1's scaling.
    rope_freq_factors: tuple[float, ...] | None = None
    qk_norm: bool = False                      # RMSNorm over each query and key head (Qwen3, Gemma 3)
    sandwich_norms: bool = False               # Gemma: norms after attention and MLP too, before the residual
    hidden_act: str = "silu"
    embedding_multiplier: float | None = None  # Gemma scales the embedding by sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power (None: head_dim's)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_window(self, index: int) -> int | None:
        """The sliding window of layer `index` (None: it attends to every earlier token)."""
        if self.layer_types is None or self.layer_types[index] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def mixes_windows(self) -> bool:
        """Some layers windowed and some not: a step's attention metadata then comes in both kinds."""
        return self.sliding_window is not None and len({self.layer_window(i) for i in range(self.num_hidden_layers)}) > 1

    def __post_init__(self) -> None:
        _family(self.model_type)
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
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ConfigError(f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the "
                                  f"{self.num_hidden_layers} layers, got {list(self.layer_types)!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unsupported hidden_act {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ConfigError(f"{len(self.rope_freq_factors)} RoPE frequency factors for a head of "
                              f"{self.head_dim} features (needs {self.head_dim // 2})")

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Build from the dict in an HF config.json, read as its family's registry entry says (the
        defaults HF applies where a key is absent, the keys the family reads at all)."""
        raw = registry.unwrap(raw)
        family = _family(raw.get("model_type"))
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ConfigError(f"config.json lacks required field(s): {', '.join(missing)}")
        heads = raw["num_attention_heads"]
        if not isinstance(heads, int) or heads <= 0:
            raise ConfigError(f"config field num_attention_heads must be a positive integer, got {heads!r}")
        _refuse_unsupported(raw)
        eos = raw.get("eos_token_id")
        rope_theta, rope_scaling, rope_local_theta = _rope_settings(raw, family)
        return cls(
            model_type=family.model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or family.default_head_dim or raw["hidden_size"] // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rope_local_theta=rope_local_theta,
            rope_freq_factors=tuple(raw["rope_freq_factors"]) if raw.get("rope_freq_factors") else None,
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            **_family_switches(raw, family),
        )


def _family(model_type: Any) -> Family:
    if model_type not in registry.FAMILIES:
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(registry.model_types())}")
    return registry.FAMILIES[model_type]


def _refuse_unsupported(raw: dict[str, Any]) -> None:
    """Settings no family here runs, refused by name rather than ignored."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if raw.get(key) is not None:
            raise ConfigError(f"{key} is not supported (got {raw[key]!r})")
    rotary = raw.get("partial_rotary_factor") or (raw.get("rope_parameters") or {}).get("partial_rotary_factor")
    if rotary not in (None, 1, 1.0):
        raise ConfigError(f"partial_rotary_factor {rotary!r} is not supported (RoPE over every head feature only)")


def _bias(raw: dict[str, Any], how: Bias, key: str) -> bool:
    return how == "always" or (how == "config" and bool(raw.get(key, False)))


def _family_switches(raw: dict[str, Any], family: Family) -> dict[str, Any]:
    """The ModelConfig fields in which families differ, as the family reads them from `raw`."""
    sliding_window = raw.get("sliding_window")
    if family.sliding_window_switch is not None and not raw.get(family.sliding_window_switch, False):
        sliding_window = None
    key = family.hidden_act_key
    activation = raw.get("hidden_activation") or (family.hidden_act if key is None else raw.get(key, family.hidden_act))
    return {
        "tie_word_embeddings": raw.get("tie_word_embeddings", family.tie_word_embeddings),
        "attention_bias": _bias(raw, family.qkv_bias, "attention_bias"),
        "attention_output_bias": _bias(raw, family.output_bias, "attention_bias"),
        "mlp_bias": _bias(raw, family.mlp_bias, "mlp_bias"),
        "sliding_window": sliding_window,
        "layer_types": None if family.window_pattern is None else _layer_types(raw, family.window_pattern),
        "qk_norm": family.qk_norm,
        "sandwich_norms": family.sandwich_norms,
        "hidden_act": activation,
        "embedding_multiplier": raw["hidden_size"] ** 0.5 if family.scaled_embedding else None,
        "query_pre_attn_scalar": (None if family.query_pre_attn_scalar is None
                                  else raw.get("query_pre_attn_scalar", family.query_pre_attn_scalar)),
    }


def _rope_settings(raw: dict[str, Any], family: Family) -> tuple[float, dict | None, float | None]:
    """(rope_theta, rope_scaling, the sliding layers' base) from either spelling HF uses: flat
    (rope_theta, rope_scaling, rope_local_base_freq) or, from transformers 5 on, one rope_parameters
    dict, which a family with a base of its own for sliding layers keys by layer type."""
    params = raw.get("rope_parameters") or {}
    local = None
    if family.local_rope:
        local = float(raw.get("rope_local_base_freq") or params.get("sliding_attention", {}).get("rope_theta") or 10000.0)
        params = params.get("full_attention", params)
    theta = raw.get("rope_theta") or params.get("rope_theta") or family.rope_theta
    scaling = raw.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling, local


def _layer_types(raw: dict[str, Any], default_pattern: int) -> tuple[str, ...]:
    """The layers' kinds: as listed, or every `sliding_window_pattern`-th layer full."""
    listed = raw.get("layer_types")
    if listed is not None:
        return tuple(listed)
    pattern = raw.get("sliding_window_pattern", default_pattern)
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(raw["num_hidden_layers"]))
