"""Qwen3: RMSNorm over each query and key head, a head of 128 features unless the config says, and
attention_bias covering q/k/v and o; the sliding window only where use_sliding_window says."""

from engine.model.architectures.family import Family

FAMILY = Family(model_type="qwen3", gguf_architecture="qwen3", default_head_dim=128, qkv_bias="config",
                output_bias="config", sliding_window_switch="use_sliding_window", qk_norm=True)
