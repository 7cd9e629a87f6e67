"""Model architectures as plain torch modules: the Llama block (llama, mistral, qwen2, qwen3, phi3) and
Gemma 3's, told apart by their config (engine/model/config.py, SUPPORTED_MODEL_TYPES)."""

from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ConfigError, ModelConfig
from engine.model.llama import LlamaForCausalLM

__all__ = ["AttentionMetadata", "ConfigError", "LlamaForCausalLM", "ModelConfig"]
