"""Mistral: Llama's block without biases, with the config's sliding_window applied to every layer.

llama.cpp writes most Mistral files as "llama"; those it writes as "mistral" have the same permuted Q/K rows.
"""

from engine.model.architectures.family import Family

FAMILY = Family(model_type="mistral", gguf_architecture="mistral", gguf_permuted_qk=True)
