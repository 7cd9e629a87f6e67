"""The workbench inference engine: Llama-family models over a paged KV cache. Imports no Django."""

from engine.engine import Engine, EngineConfig, GenerationResult, Usage
from engine.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "GenerationResult", "SamplingParams", "Usage"]
