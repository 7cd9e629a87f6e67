"""Qwen2 (and Qwen2.5): q/k/v always biased, o never; the sliding window only where use_sliding_window says."""

from engine.model.architectures.family import Family

FAMILY = Family(model_type="qwen2", gguf_architecture="qwen2", qkv_bias="always",
                sliding_window_switch="use_sliding_window")
