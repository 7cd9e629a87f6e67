"""Model architectures as plain torch modules: the Llama block with each family's declared differences
(engine/model/architectures/, one module per family), switched by ModelConfig (engine/model/config.py)."""

from engine.model.attention_metadata import AttentionMetadata
from engine.model.config import ConfigError, ModelConfig
from engine.model.llama import LlamaForCausalLM

__all__ = ["AttentionMetadata", "ConfigError", "LlamaForCausalLM", "ModelConfig"]
