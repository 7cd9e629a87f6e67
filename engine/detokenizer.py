"""Incremental detokenization with stop strings: output ids -> the text a client may see, step by step.

Two things are held back from the client until they are settled:
- an incomplete UTF-8 character at the end (byte-level tokens can split one; it decodes as U+FFFD),
  so a stream never carries a broken character that a later token would have completed;
- a tail that could still grow into a stop string, because a stop string is never sent.
When a stop string appears (it may span several tokens), the visible text ends just before it.
"""

from __future__ import annotations

from engine.loading.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._longest_stop = max((len(s) for s in stop), default=0)
        self.sent_chars = 0
        self.text = ""  # the whole output decoded, complete characters only, stop strings included

    def update(self, output_ids: list[int], final: bool) -> tuple[str, bool]:
        """Returns (text newly visible since the last call, whether a stop string was found).
        With final=True nothing is held back any more (the sequence ended for another reason)."""
        # Decoding the whole output each step keeps this simple and exact: a decode of a few hundred
        # tokens costs microseconds, and the text of a prefix never has to be patched up.
        text = self._tokenizer.decode(output_ids)
        if not final:
            text = text.rstrip(REPLACEMENT_CHAR)
        self.text = text
        stop_at = self._find_stop(text)
        if stop_at is not None:
            visible, hit = text[:stop_at], True
        elif final:
            visible, hit = text, False
        else:
            visible, hit = text[: len(text) - self._held_tail(text)], False
        delta = visible[self.sent_chars:] if len(visible) > self.sent_chars else ""
        self.sent_chars += len(delta)
        return delta, hit

    def _find_stop(self, text: str) -> int | None:
        if not self._stop:
            return None
        # A stop string cannot start inside text already sent (its prefix would have been held back),
        # so the search starts just before the sent text ends.
        start = max(0, self.sent_chars - self._longest_stop + 1)
        found = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
        return min(found) if found else None

    def _held_tail(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of some stop string."""
        for length in range(min(self._longest_stop - 1, len(text)), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self._stop):
                return length
        return 0
