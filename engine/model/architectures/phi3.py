"""Phi-3: Llama's block without biases, its q/k/v and gate/up projections each stored as one tensor
(split on loading, engine/loading/fused_tensors.py)."""

from engine.model.architectures.family import Family

FAMILY = Family(model_type="phi3", gguf_architecture="phi3",
                gguf_tensors={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"})
