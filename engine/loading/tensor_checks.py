"""A checkpoint's tensors checked against the model they load into, whatever the source (safetensors or
GGUF): every tensor expected, with the shape the config implies, and none left out. Each failure is a
ModelLoadError naming the file and the tensor."""

from __future__ import annotations

import torch

from engine.loading.model_errors import ModelLoadError
from engine.model.llama import LlamaForCausalLM


def expected_tensors(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors by HF name, less a tied lm_head (it shares embed_tokens; checkpoints may or
    may not repeat it)."""
    expected = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    return expected


def check_tensor(expected: dict[str, torch.Tensor], source: str, name: str, shape: tuple[int, ...]) -> None:
    if name not in expected:
        raise ModelLoadError(f"{source}: unexpected tensor {name!r} for this architecture")
    if tuple(shape) != tuple(expected[name].shape):
        raise ModelLoadError(f"{source}: tensor {name!r} has shape {tuple(shape)}, "
                             f"the config implies {tuple(expected[name].shape)}")


def check_complete(expected: dict[str, torch.Tensor], seen: set[str]) -> None:
    missing = sorted(set(expected) - seen)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"checkpoint lacks tensor(s): {shown}")
