"""The bytes one token stands for, as OpenAI's logprobs report them (`bytes`).

A single token's decoded text can be a broken character (byte-level BPE splits UTF-8 sequences across
tokens; it decodes as U+FFFD), so its bytes come from the vocabulary entry itself: byte-level BPE
writes each byte as one printable character (GPT-2's table, inverted here), SentencePiece's byte
fallback writes `<0xHH>` and a space as U+2581, added tokens are their own text. Anything else is its decoded text's UTF-8.
"""

from __future__ import annotations

import re
from functools import lru_cache

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_level_chars() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: printable bytes stand for themselves, the
    other 68 are shifted past 255 in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


def vocabulary_bytes(piece: str, byte_level: bool) -> bytes | None:
    """The bytes of a vocabulary entry, or None when its spelling does not say (the caller decodes)."""
    fallback = _BYTE_FALLBACK.fullmatch(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    if byte_level:
        table = byte_level_chars()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
    elif "\u2581" in piece:  # SentencePiece writes a space as U+2581; decoding one token alone may strip it
        return piece.replace("\u2581", " ").encode("utf-8")
    return None
