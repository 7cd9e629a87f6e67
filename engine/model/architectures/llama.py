"""Llama (Llama 2 and 3, SmolLM2, TinyLlama): the block the other families declare their differences from.

Its attention_bias covers q/k/v and o alike, mlp_bias the MLP; llama.cpp's converter permutes its Q/K rows.
"""

from engine.model.architectures.family import Family

FAMILY = Family(model_type="llama", gguf_architecture="llama", qkv_bias="config", output_bias="config",
                mlp_bias="config", gguf_permuted_qk=True)
