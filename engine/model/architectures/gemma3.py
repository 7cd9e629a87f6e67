"""Gemma 3 (its language model): norms around attention and MLP, q/k norms, GeGLU, the embedding scaled by
sqrt(hidden_size), tied embeddings, and windowed layers with a RoPE base of their own between full ones.

HF's multimodal "gemma3" config holds it as text_config. Where the GGUF metadata is silent, llama.cpp
assumes every sixth layer full, RoPE base 10,000 on the windowed ones, and a query scale of the head size
(hidden_size / heads for the 62-layer 27B).
"""

from __future__ import annotations

from typing import Any

from engine.model.architectures.family import ArchReader, Family

WINDOW_PATTERN = 6
SLIDING_ROPE_BASE = 10000.0
LAYERS_OF_27B = 62


def gguf_settings(arch: ArchReader, raw: dict[str, Any], head_dim: int) -> dict[str, Any]:
    layers = raw["num_hidden_layers"]
    pattern = arch("attention.sliding_window_pattern", WINDOW_PATTERN)
    if isinstance(pattern, list):  # one flag per layer: True where the layer is windowed
        kinds = ["sliding_attention" if windowed else "full_attention" for windowed in pattern]
    else:
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    scalar = raw["hidden_size"] // raw["num_attention_heads"] if layers == LAYERS_OF_27B else head_dim
    return {"layer_types": kinds, "query_pre_attn_scalar": scalar,
            "rope_local_base_freq": arch("rope.freq_base_swa", SLIDING_ROPE_BASE)}


FAMILY = Family(
    model_type="gemma3_text", gguf_architecture="gemma3", wrapper_model_types=("gemma3",),
    default_head_dim=256, rope_theta=1e6, local_rope=True, window_pattern=WINDOW_PATTERN, qk_norm=True,
    sandwich_norms=True, hidden_act_key=None, hidden_act="gelu_pytorch_tanh",
    tie_word_embeddings=True, scaled_embedding=True, query_pre_attn_scalar=256,
    gguf_tensors={"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                  "post_ffw_norm": "post_feedforward_layernorm"},
    gguf_settings=gguf_settings,
)
