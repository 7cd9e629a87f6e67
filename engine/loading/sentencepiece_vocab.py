"""A SentencePiece BPE vocabulary, as GGUF files store it, rebuilt as a `tokenizers` BPE model.

llama.cpp keeps a SentencePiece vocabulary (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral 7B,
TinyLlama, Gemma) as its pieces, one score per piece and one type per piece, and no merges. SentencePiece
BPE merges, at every step, the adjacent pair whose joined piece ranks best; `tokenizers`' BPE applies the
best-ranked merge. So each way to cut a piece into two pieces of the vocabulary becomes one merge, ranked
as the piece ranks: by its score (Llama, Mistral), or by its place in the file (Gemma, whose scores do
not follow its merge order). Merges of one rank are ordered as transformers' GGUF reader orders them
(longer left part first, then in file order), so both tokenize alike. Characters outside the
vocabulary fall back to the `<0xNN>` byte pieces.

Spaces are written as U+2581 ("▁"). Llama's vocabularies also prefix the text, and each stretch of it
after a special token, with one (where the file's `add_space_prefix` says so, its default) and drop it
again on decode; Gemma's never do, and Gemma files store pieces made only of spaces with real spaces,
renamed here to the "▁" spelling the text gets.
"""

from __future__ import annotations

from typing import Sequence

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers

SPACE = "\u2581"


def gemma_pieces(pieces: Sequence[str]) -> list[str]:
    """Gemma's pieces with those made only of spaces spelled as the text is spelled ("▁▁")."""
    return [SPACE * len(p) if p and not p.strip(" ") else p for p in pieces]


def sentencepiece_backend(pieces: Sequence[str], scores: Sequence[float] | None, *, gemma: bool,
                          add_space_prefix: bool, unknown: str | None) -> BackendTokenizer:
    """`pieces` spelled as the text is (gemma_pieces for Gemma); `scores` ranks the merges (None: rank
    by file order, as Gemma needs); `unknown` is the piece for text nothing else covers (with byte
    fallback, only a byte missing from the vocabulary)."""
    vocab = {piece: index for index, piece in enumerate(pieces)}
    rank: dict[str, float] = ({p: -float(i) for i, p in enumerate(pieces)} if scores is None or gemma
                              else dict(zip(pieces, (float(s) for s in scores))))
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=_merges(vocab, rank), fuse_unk=True,
                                          byte_fallback=True, unk_token=unknown))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    spaces: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix and not gemma:
        # Always one space more, also before text that starts with spaces and after a special token, as
        # sentencepiece's dummy prefix and llama.cpp do (Metaspace's prepend skips text already starting
        # with one, and its "first" only prefixes the text before the first special token).
        spaces.insert(0, normalizers.Prepend(SPACE))
        steps.append(decoders.Strip(content=" ", left=1))
    backend.normalizer = normalizers.Sequence(spaces)
    backend.decoder = decoders.Sequence(steps)
    return backend


def _merges(vocab: dict[str, int], rank: dict[str, float]) -> list[tuple[str, str]]:
    """Every (left, right) of vocabulary pieces that joins into a piece, best-ranked joined piece first."""
    found: list[tuple[float, int, int, int, str, str]] = []
    for order, (piece, score) in enumerate(rank.items()):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                # Sorted ascending, so the keys are negated where the order is best-first; ties keep
                # the pieces' file order.
                found.append((-score, -len(left), -len(right), order, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]
