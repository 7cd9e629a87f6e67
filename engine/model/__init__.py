"""Model architectures: the Llama family (llama, mistral, qwen2) as plain torch modules."""

from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ConfigError, ModelConfig
from engine.model.llama import LlamaForCausalLM

__all__ = ["AttentionMetadata", "ConfigError", "LlamaForCausalLM", "ModelConfig"]
