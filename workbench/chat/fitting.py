"""Fitting a conversation into the model: the oldest turns give way when the whole no longer fits.

A chat grows with every turn and the model reads at most its length (the demo model: 512 tokens), so
past that every send would fail for good. Like the chat products people know, the model is then shown
the newest turns that fit, from a user message on, with room left for at least one token of reply; a
leading system message stays. The page still shows (and stores) the whole conversation.
"""

from __future__ import annotations

from django.conf import settings

from engine.loading.tokenizer import Tokenizer, TokenizerError
from workbench.serving.model_facts import model_length


def fitted_prompt(tokenizer: Tokenizer, history: list[dict], model: str | None = None) -> list[int]:
    """Token ids of the newest part of `history` that fits `model` (None: WORKBENCH_MODEL), whose
    tokenizer `tokenizer` is; TokenizerError if the last message alone does not (its author must shorten it)."""
    limit = model_length(model or settings.WORKBENCH_MODEL) - 1  # room for a reply's first token
    system = history[:1] if history and history[0]["role"] == "system" else []
    turns = history[len(system):]

    def without_oldest(dropped: int) -> list[int]:
        return tokenizer.encode_chat(system + turns[dropped:])

    ids = without_oldest(0)
    if len(ids) <= limit:
        return ids  # the usual case: one encoding
    # What is kept starts at a user message (templates may insist that roles alternate from one), and
    # dropping more never makes it longer: bisect over those starts for the fewest dropped (log n
    # encodings of a conversation that may be long, not one per turn).
    starts = [n for n, turn in enumerate(turns) if turn["role"] == "user" and n > 0] or [len(turns) - 1]
    last = without_oldest(starts[-1])
    if len(last) > limit:
        raise TokenizerError(f"the message is {len(last)} tokens with the chat template; this model reads at "
                             f"most {limit + 1}: shorten it")
    fits, too_long = len(starts) - 1, -1  # indices into starts
    while fits - too_long > 1:
        middle = (fits + too_long) // 2
        if len(candidate := without_oldest(starts[middle])) <= limit:
            fits, last = middle, candidate
        else:
            too_long = middle
    return last
