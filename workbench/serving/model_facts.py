"""What the web side knows of a served model without loading it: its length and its vocabulary, read
from the model's config, and its card (architecture, format, size, quantization: engine/loading/model_card.py),
read from its files' headers; no weights, once per model per process.

Both transports' engines serve the model as its config describes it (neither sets a shorter length or
another vocabulary), and the web side reads the same files it reads the tokenizer from (the model name
a worker's heartbeat reports is the path or packaged name it loaded), so these are the engine's facts.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

from engine.loading.model_card import ModelCard
from engine.loading.model_card import model_card as read_model_card
from engine.loading.model_errors import ModelLoadError
from engine.loading.model_files import load_model_config

Fact = TypeVar("Fact")


@lru_cache(maxsize=None)
def model_length(model: str) -> int:
    """The model's length in tokens."""
    return load_model_config(model).max_position_embeddings


@lru_cache(maxsize=None)
def vocabulary_size(model: str) -> int:
    """How many token ids the model has a logit for: a token id is an integer from 0 to this - 1."""
    return load_model_config(model).vocab_size


@lru_cache(maxsize=None)
def model_card(model: str) -> ModelCard:
    return read_model_card(model)


@lru_cache(maxsize=None)
def embedding_length(model: str) -> int:
    """The width of the model's hidden states."""
    return load_model_config(model).hidden_size


def if_readable(fact: Callable[[str], Fact], model: str) -> Fact | None:
    """`fact(model)`, or None where this process cannot read the model's files: a Celery web process need
    not hold every file a worker's model has, and a listing shows what it can rather than failing."""
    try:
        return fact(model)
    except (ModelLoadError, OSError, ValueError):
        return None
