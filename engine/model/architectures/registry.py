"""The families the engine runs, looked up by HF model_type or GGUF architecture.

FAMILIES lists each family module's entry, in the order error messages name them. A new family is a
module beside this one with a FAMILY entry, named here.
"""

from __future__ import annotations

from engine.model.architectures import gemma3, llama, mistral, phi3, qwen2, qwen3
from engine.model.architectures.family import Family

FAMILIES: dict[str, Family] = {module.FAMILY.model_type: module.FAMILY
                               for module in (llama, mistral, qwen2, qwen3, phi3, gemma3)}


def register(family: Family) -> None:
    """Adds a family (one defined outside this package, as a test's); ValueError where its model_type
    or GGUF architecture is taken."""
    if family.model_type in FAMILIES:
        raise ValueError(f"model_type {family.model_type!r} is registered already")
    if family.gguf_architecture is not None and family.gguf_architecture in gguf_architectures():
        raise ValueError(f"GGUF architecture {family.gguf_architecture!r} is registered already")
    FAMILIES[family.model_type] = family


def model_types() -> tuple[str, ...]:
    return tuple(FAMILIES)


def gguf_architectures() -> dict[str, Family]:
    """GGUF general.architecture -> its family."""
    return {f.gguf_architecture: f for f in FAMILIES.values() if f.gguf_architecture is not None}


def unwrap(raw: dict) -> dict:
    """A wrapper config (a multimodal model's) -> its language model's config; any other unchanged."""
    text = raw.get("text_config")
    for family in FAMILIES.values():
        if raw.get("model_type") in family.wrapper_model_types and isinstance(text, dict):
            return {**text, "model_type": family.model_type}
    return raw
