"""The workbench inference engine: Llama-family models over a paged KV cache. Imports no Django.

The names below are loaded on first use (PEP 562), not with the package: `import engine.sampling_params`
or `import engine.host.capabilities` runs this file first, and a web process or a management command
that only validates requests must not pay for torch and the model code (seconds per process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.engine_config import EngineConfig
    from engine.intake import PromptError, RequestError
    from engine.outputs import GenerationResult, RequestOutput, Usage
    from engine.sampling_params import InvalidSamplingParams, SamplingParams

_HOME = {"Engine": "engine.engine", "EngineConfig": "engine.engine_config", "PromptError": "engine.intake",
         "RequestError": "engine.intake", "GenerationResult": "engine.outputs", "RequestOutput": "engine.outputs",
         "Usage": "engine.outputs", "InvalidSamplingParams": "engine.sampling_params",
         "SamplingParams": "engine.sampling_params"}

__all__ = ["Engine", "EngineConfig", "GenerationResult", "InvalidSamplingParams", "PromptError", "RequestError",
           "RequestOutput", "SamplingParams", "Usage"]


if not TYPE_CHECKING:  # hidden from mypy, which reads the imports above: a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        if name not in _HOME:
            raise AttributeError(f"module 'engine' has no attribute {name!r}")
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value  # found directly from now on
        return value
