"""A SentencePiece vocabulary rebuilt as a `tokenizers` BPE: the pieces' ranks order the merges, Llama's
prefix space comes and goes, characters outside the vocabulary fall back to byte pieces, and each
token's bytes keep their space. (The real Gemma 3 vocabulary against HF is in test_gemma3.py.)"""

from __future__ import annotations

from engine.loading.sentencepiece_vocab import sentencepiece_backend
from engine.loading.tokenizer import Tokenizer

PIECES = ["<unk>", "<s>", "</s>", "<0x21>", "\u2581", "a", "b", "c", "ab", "bc", "\u2581a", "\u2581ab"]


def tokenizer(scores: dict[str, float], add_space_prefix: bool = True) -> Tokenizer:
    ranked = [scores.get(piece, -100.0) for piece in PIECES]
    backend = sentencepiece_backend(PIECES, ranked, gemma=False, add_space_prefix=add_space_prefix, unknown="<unk>")
    return Tokenizer(backend, {"unk_token": "<unk>"}, None)


def pieces(tok: Tokenizer, text: str) -> list[str]:
    return [PIECES[i] for i in tok.encode(text)]


def test_the_better_ranked_piece_is_merged_first():
    assert pieces(tokenizer({"ab": -1.0, "bc": -2.0}, add_space_prefix=False), "abc") == ["ab", "c"]
    assert pieces(tokenizer({"ab": -2.0, "bc": -1.0}, add_space_prefix=False), "abc") == ["a", "bc"]


def test_llama_spacing_prefixes_a_space_and_decoding_drops_it():
    tok = tokenizer({"\u2581ab": -1.0, "\u2581a": -2.0, "ab": -3.0})
    assert pieces(tok, "ab ab") == ["\u2581ab", "\u2581ab"]
    assert tok.decode(tok.encode("ab ab")) == "ab ab"
    assert pieces(tokenizer({"ab": -1.0}, add_space_prefix=False), "ab") == ["ab"]


def test_a_character_outside_the_vocabulary_falls_back_to_its_byte_piece():
    tok = tokenizer({"ab": -1.0}, add_space_prefix=False)
    assert pieces(tok, "ab!") == ["ab", "<0x21>"]
    assert tok.decode(tok.encode("ab!")) == "ab!"
    assert pieces(tok, "ab?") == ["ab", "<unk>"]  # no byte piece for "?": the unknown piece


def test_each_tokens_bytes_keep_the_space_its_piece_stands_for():
    tok = tokenizer({"\u2581ab": -1.0})
    [first, second] = tok.encode("ab ab")
    assert tok.token_bytes(first) == b" ab" and tok.token_bytes(second) == b" ab"
    assert tok.decode([first]) == "ab", "alone, the prefix space is dropped: bytes must not come from decode"
