"""Logprob records (a StreamEvent's `logprobs`: [token_id, logprob, [[id, logprob], ...]] per token)
in the shapes clients read: OpenAI's chat `logprobs.content`, OpenAI's completions `logprobs` (tokens,
token_logprobs, top_logprobs, text_offset), and the websocket API's delta field (docs/PROTOCOL.md,
"Logprobs"). A whole reply and its stream are built from the same records by the same functions, so
they carry equal values.
"""

from __future__ import annotations

import math

from engine.loading.tokenizer import Tokenizer

# JSON has no -inf; a token the penalties pushed to -inf is reported as this, as vLLM does.
FLOOR = -9999.0


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def _token(tokenizer: Tokenizer, token_id: int) -> dict[str, object]:
    return {"token": tokenizer.decode([token_id], skip_special_tokens=False),
            "bytes": list(tokenizer.token_bytes(token_id))}


def chat_content(tokenizer: Tokenizer, records: list[list]) -> list[dict[str, object]]:
    """OpenAI's `choices[].logprobs.content` (or a chunk's part of it)."""
    return [{**_token(tokenizer, token_id), "logprob": _value(logprob),
             "top_logprobs": [{**_token(tokenizer, top_id), "logprob": _value(top_lp)} for top_id, top_lp in top]}
            for token_id, logprob, top in records]


def socket_logprobs(tokenizer: Tokenizer, records: list[list]) -> list[dict[str, object]]:
    """The websocket API's `delta.logprobs`: the chat shape, with each token's id beside it."""
    shaped = chat_content(tokenizer, records)
    for item, (token_id, _, top) in zip(shaped, records):
        item["token_id"] = token_id
        for top_item, (top_id, _) in zip(item["top_logprobs"], top):  # type: ignore[call-overload]
            top_item["token_id"] = top_id
    return shaped


class CompletionLogprobs:
    """OpenAI's completions `logprobs` for one choice, built delta by delta: `text_offset` runs on
    across the deltas of a stream (each token's offset is the length of the text of the tokens before
    it, each decoded alone without special tokens, as the reply's text is). An echoed prompt's records
    come first, its first token's logprob and top_logprobs null."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.offset = 0

    def part(self, records: list[list]) -> dict[str, list]:
        shaped: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, logprob, top in records:
            shaped["tokens"].append(self.tokenizer.decode([token_id], skip_special_tokens=False))
            if logprob is None:  # an echoed prompt's first token: nothing precedes it
                shaped["token_logprobs"].append(None)
                shaped["top_logprobs"].append(None)
            else:
                shaped["token_logprobs"].append(_value(logprob))
                shaped["top_logprobs"].append({self.tokenizer.decode([top_id], skip_special_tokens=False):
                                               _value(top_lp) for top_id, top_lp in top})
            shaped["text_offset"].append(self.offset)
            self.offset += len(self.tokenizer.decode([token_id]))
        return shaped
