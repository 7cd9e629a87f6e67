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
    """Each update decodes only a window of the newest tokens, so its cost does not grow with the output:
    the tokens from `_prefix_offset` on, against the same window without the new ones (up to
    `_read_offset`), as vLLM does. Decoding both from the same first token keeps a tokenizer's rules for
    a decode's first token (a stripped leading space) out of the difference, and a window always starts
    on a complete character, so the new text is exactly what a decode of the whole output adds."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._longest_stop = max((len(s) for s in stop), default=0)
        self.sent_chars = 0
        self.text = ""  # the whole output decoded, complete characters only, stop strings included
        self._read_text = ""  # the text of the tokens before `_read_offset`, which ends on a whole character
        self._prefix_offset = 0
        self._read_offset = 0

    def update(self, output_ids: list[int], final: bool) -> tuple[str, bool]:
        """Returns (text newly visible since the last call, whether a stop string was found).
        With final=True nothing is held back any more (the sequence ended for another reason)."""
        if self._read_offset < len(output_ids):
            self._decode_new(output_ids, final)
        text = self.text
        stop_at = self._find_stop(text)
        if stop_at is not None:
            visible_end, hit = stop_at, True
        elif final:
            visible_end, hit = len(text), False
        else:
            visible_end, hit = len(text) - self._held_tail(text), False
        delta = text[self.sent_chars: visible_end] if visible_end > self.sent_chars else ""
        self.sent_chars += len(delta)
        return delta, hit

    def _decode_new(self, output_ids: list[int], final: bool) -> None:
        decode = self._tokenizer.decode
        before = decode(output_ids[self._prefix_offset: self._read_offset])
        window = decode(output_ids[self._prefix_offset:])
        if final or not window.endswith(REPLACEMENT_CHAR):
            new_text = window[len(before):]
            self._read_text += new_text
            self.text = self._read_text
            # Tokens that decode to nothing (skipped special tokens) must not start the next window: its
            # decode would then strip a leading space from the first token that has text, which a decode
            # of the whole output keeps.
            if new_text:
                self._prefix_offset = self._read_offset
            self._read_offset = len(output_ids)
        else:  # the newest token ends inside a character: its complete characters show, the window stays
            self.text = self._read_text + window.rstrip(REPLACEMENT_CHAR)[len(before):]

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
