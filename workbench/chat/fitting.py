"""Fitting a conversation into the model: the oldest turns give way when the whole no longer fits.

A chat grows with every turn and the model reads at most its length (the demo model: 512 tokens), so
past that every send would fail for good. Like the chat products people know, the model is then shown
the newest turns that fit, with room left for at least one token of reply; a leading system message
stays. The page still shows (and stores) the whole conversation.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from engine.loader import load_config, resolve_model_path
from engine.tokenizer import Tokenizer, TokenizerError


@lru_cache(maxsize=None)
def model_length(model: str) -> int:
    """The configured model's length in tokens (its config.json; no weights are read)."""
    return load_config(resolve_model_path(model)).max_position_embeddings


def fitted_prompt(tokenizer: Tokenizer, history: list[dict]) -> list[int]:
    """Token ids of the newest part of `history` that fits; TokenizerError if the last message alone
    does not (its author must shorten it)."""
    limit = model_length(settings.WORKBENCH_MODEL) - 1  # room for a reply's first token
    system = history[:1] if history and history[0]["role"] == "system" else []
    turns = history[len(system):]
    while True:
        ids = tokenizer.encode_chat(system + turns)
        if len(ids) <= limit:
            return ids
        if len(turns) <= 1:
            raise TokenizerError(f"the message is {len(ids)} tokens with the chat template; this model reads at "
                                 f"most {limit + 1}: shorten it")
        turns = turns[1:]
