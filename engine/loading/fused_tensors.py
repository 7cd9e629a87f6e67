"""Checkpoint tensors that hold several of our parameters, and the ranges of rows each one is.

Phi-3 stores its query, key and value projections as one `qkv_proj` (GGUF: `attn_qkv`) and its gate and
up projections as one `gate_up_proj` (GGUF: `ffn_up`, twice the MLP width); our model keeps them apart
under Llama's names and fuses them again itself (fuse_for_inference). A weight's output rows are
independent, so the split is a row slice, as valid for the blocks of a quantized GGUF tensor as for
floats.
"""

from __future__ import annotations

from engine.model.config import ModelConfig



def split_rows(config: ModelConfig, name: str, rows: int) -> list[tuple[str, slice]] | None:
    """[(parameter name, its rows)] where `name` (HF spelling) is a fused tensor of `rows` rows; None
    where it is one parameter."""
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    layouts = {".self_attn.qkv_proj.": [("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)],
               ".mlp.gate_up_proj.": [("mlp.gate_proj", rows // 2), ("mlp.up_proj", rows // 2)]}
    for fused, parts in layouts.items():
        layer, found, kind = name.partition(fused)
        if found:
            starts = [sum(size for _, size in parts[:i]) for i in range(len(parts))]
            return [(f"{layer}.{part}.{kind}", slice(start, start + size))
                    for (part, size), start in zip(parts, starts)]
    return None
