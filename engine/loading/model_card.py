"""A model's card: what a catalogue shows of it (its architecture, its files' format, size and
quantization, its parameter count), read from the files' headers without loading a weight.

The web side's model listings show it: Ollama's /api/tags, /api/ps and /api/show, whose clients display
the size and quantization and look the context length up under the architecture's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from engine.loading.model_files import checkpoint_files, gguf_checkpoint, is_gguf, load_config, resolve_model_path


@dataclass(frozen=True)
class ModelCard:
    architecture: str     # GGUF's general.architecture, or the HF config's model_type
    file_format: str      # "gguf" or "safetensors"
    parameter_count: int  # the weights' elements as the files hold them
    quantization: str     # llama.cpp's name of a GGUF file's type ("Q4_1"), or the safetensors' dtype ("BF16")
    file_bytes: int       # the weights' files on disk


def model_card(name_or_path: str | Path) -> ModelCard:
    path = resolve_model_path(name_or_path)
    if is_gguf(path):
        checkpoint = gguf_checkpoint(path)
        return ModelCard(checkpoint.architecture, "gguf", checkpoint.parameter_count, checkpoint.quantization,
                         path.stat().st_size)
    return _safetensors_card(path)


def _safetensors_card(directory: Path) -> ModelCard:
    from safetensors import safe_open

    files = checkpoint_files(directory)
    elements: dict[str, int] = {}  # dtype -> the elements stored in it
    for file in files:
        with safe_open(file, framework="numpy") as tensors:
            for name in tensors.keys():
                stored = tensors.get_slice(name)
                elements[stored.get_dtype()] = elements.get(stored.get_dtype(), 0) + math.prod(stored.get_shape())
    return ModelCard(load_config(directory).model_type, "safetensors", sum(elements.values()),
                     max(elements, key=elements.__getitem__), sum(file.stat().st_size for file in files))
