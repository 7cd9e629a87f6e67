"""The workbench inference engine: Llama-family models over a paged KV cache. Imports no Django."""

from engine.engine import Engine
from engine.intake import PromptError, RequestError
from engine.engine_config import EngineConfig
from engine.outputs import GenerationResult, RequestOutput, Usage
from engine.sampling_params import InvalidSamplingParams, SamplingParams

__all__ = ["Engine", "EngineConfig", "GenerationResult", "InvalidSamplingParams", "PromptError", "RequestError",
           "RequestOutput", "SamplingParams", "Usage"]
