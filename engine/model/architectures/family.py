"""Family: one model family's entry, what tells it apart from the others as data.

Every family is the Llama block with declared differences. An entry says how to read its HF config.json
(its model_type, the defaults HF's own config class applies where a key is absent, which keys it reads at
all) and its GGUF file (llama.cpp's architecture name, tensor names, row permutation, defaults where the
metadata is silent). ModelConfig.from_hf_dict and engine/loading/gguf_model.py read the entry; neither
names a family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# How a bias is read: present in every checkpoint, read from the config key that names it, or absent.
Bias = Literal["always", "config", "never"]
# A GGUF reader of the family's own metadata keys: arch("rope.freq_base_swa", default) reads
# "<architecture>.rope.freq_base_swa".
ArchReader = Callable[[str, Any], Any]
# Settings a family infers from a GGUF file (its HF-style config dict so far and its head size) where
# llama.cpp assumes them rather than writing them.
GGUFSettings = Callable[[ArchReader, dict[str, Any], int], dict[str, Any]]


@dataclass(frozen=True)
class Family:
    model_type: str                                  # HF config.json's model_type, ModelConfig's
    gguf_architecture: str | None = None             # GGUF general.architecture (None: no GGUF route)
    # Config model_types whose `text_config` is this family (a multimodal wrapper's language model).
    wrapper_model_types: tuple[str, ...] = ()

    # config.json's defaults and switches
    default_head_dim: int | None = None              # where head_dim is absent (None: hidden_size / heads)
    rope_theta: float = 10000.0                      # where rope_theta is absent
    local_rope: bool = False                         # sliding layers have a RoPE base of their own
    qkv_bias: Bias = "never"                         # the config key: attention_bias
    output_bias: Bias = "never"                      # the config key: attention_bias
    mlp_bias: Bias = "never"                         # the config key: mlp_bias
    # A key that must be true for the config's sliding_window to apply (None: it applies as given).
    sliding_window_switch: str | None = None
    # Layers of two kinds: as layer_types lists them, or every n-th full and the others windowed, n from
    # sliding_window_pattern or this default (None: every layer alike).
    window_pattern: int | None = None
    qk_norm: bool = False                            # RMSNorm over each query and key head
    sandwich_norms: bool = False                     # norms after attention and MLP too, before the residual
    # The MLP's activation: hidden_activation where set, else this key's value (None: not read), else
    # hidden_act.
    hidden_act_key: str | None = "hidden_act"
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False                # where the config does not say
    scaled_embedding: bool = False                   # the embedding times sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None       # where absent; None: the key is not read (head_dim's)

    # GGUF
    gguf_permuted_qk: bool = False                   # llama.cpp's converter permuted the Q/K rows
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)  # layer tensor names unlike Llama's
    gguf_settings: GGUFSettings | None = None
