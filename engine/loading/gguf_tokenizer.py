"""The tokenizer of a GGUF file, built with `tokenizers` from the file's metadata.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, the merges, each token's type and the
special ids as metadata (`tokenizer.ggml.*`), and the chat template as `tokenizer.chat_template`. This
module rebuilds the byte-level BPE tokenizer those keys describe (`tokenizer.ggml.model == "gpt2"`:
SmolLM, Qwen2, Llama 3 and most recent models), splitting text the way the vocabulary's merges were
learned (`tokenizer.ggml.pre`), or the SentencePiece BPE vocabulary (`"llama"`: Llama 2, Mistral 7B,
TinyLlama, Gemma; engine/loading/sentencepiece_vocab.py), and hands it to our `Tokenizer`, so encode,
decode and chat rendering behave as for an HF directory.
"""

from __future__ import annotations

from typing import Any, Callable, cast

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from engine.loading.sentencepiece_vocab import gemma_pieces, sentencepiece_backend
from engine.loading.tokenizer import Tokenizer, TokenizerError

# llama.cpp's token types (gguf.TokenType): CONTROL and UNKNOWN tokens are special (matched whole in
# text, skipped on decode, as llama.cpp and transformers treat <unk>); USER_DEFINED ones are matched
# whole in text but decoded like any other token.
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4

# How each `tokenizer.ggml.pre` splits text before byte-level BPE. None: the GPT-2 pattern that
# ByteLevel applies itself. The patterns are the ones the models' own tokenizer.json files use.
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_PATTERNS: dict[str, str | None] = {
    "default": None, "gpt-2": None, "gpt2": None, "smollm": None,
    "llama3": _LLAMA3_PATTERN, "llama-v3": _LLAMA3_PATTERN, "llama-bpe": _LLAMA3_PATTERN,
    "smaug-bpe": _LLAMA3_PATTERN,
    "qwen2": _QWEN2_PATTERN, "deepseek-r1-qwen": _QWEN2_PATTERN,
}


def tokenizer_from_gguf(metadata: Callable[..., Any], source: str) -> Tokenizer:
    """`metadata(key, default=...)` reads one GGUF key (engine/loading/gguf_model.py); `source` names the file
    in errors."""
    kind = metadata("tokenizer.ggml.model", None)
    if kind not in ("gpt2", "llama"):
        raise TokenizerError(f"{source}: tokenizer.ggml.model {kind!r} is not supported; "
                             "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece BPE)")
    tokens: list[str] = metadata("tokenizer.ggml.tokens")
    types: list[int] = metadata("tokenizer.ggml.token_type", [1] * len(tokens))
    if len(types) != len(tokens):
        raise TokenizerError(f"{source}: {len(types)} token types for {len(tokens)} tokens")
    if kind == "llama" and str(metadata("general.architecture", "")).startswith("gemma"):
        tokens = gemma_pieces(tokens)
    backend = (_byte_level_backend(metadata, source, tokens) if kind == "gpt2"
               else _sentencepiece_backend(metadata, source, tokens))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, kind in zip(tokens, types) if kind in (_CONTROL, _UNKNOWN)])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, kind in zip(tokens, types) if kind == _USER_DEFINED])

    def token(key: str) -> str | None:
        index = metadata(f"tokenizer.ggml.{key}", None)
        if index is None:
            return None
        if not 0 <= index < len(tokens):
            raise TokenizerError(f"{source}: tokenizer.ggml.{key} {index} is outside the vocabulary")
        return tokens[index]

    special = {"bos_token": token("bos_token_id"), "eos_token": token("eos_token_id"),
               "unk_token": token("unknown_token_id"), "pad_token": token("padding_token_id")}
    # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise.
    if metadata("tokenizer.ggml.add_bos_token", kind == "llama") and special["bos_token"] is not None:
        bos = special["bos_token"]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, metadata("tokenizer.ggml.bos_token_id"))])
    config = {name: text for name, text in special.items() if text is not None}
    return Tokenizer(backend, config, metadata("tokenizer.chat_template", None))


def _byte_level_backend(metadata: Callable[..., Any], source: str, tokens: list[str]) -> BackendTokenizer:
    pre = metadata("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZER_PATTERNS:
        raise TokenizerError(f"{source}: tokenizer.ggml.pre {pre!r} is not supported; "
                             f"supported: {', '.join(sorted(PRE_TOKENIZER_PATTERNS))}")
    merges: list[str] = metadata("tokenizer.ggml.merges")
    pairs = [tuple(merge.split(" ")) for merge in merges]
    bad = next((m for m, pair in zip(merges, pairs) if len(pair) != 2), None)
    if bad is not None:
        raise TokenizerError(f"{source}: merge {bad!r} is not two tokens separated by one space")
    two_token_pairs = cast("list[tuple[str, str]]", pairs)  # every pair's length was checked just above
    try:
        backend = BackendTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=two_token_pairs,
                                              fuse_unk=False, byte_fallback=False))
    except Exception as exc:  # the Rust library raises plain Exception on an inconsistent vocabulary
        raise TokenizerError(f"{source}: the vocabulary and merges do not form a BPE model ({exc})") from exc
    pattern = PRE_TOKENIZER_PATTERNS[pre]
    backend.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True) if pattern is None
                             else pre_tokenizers.Sequence([
                                 pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_backend(metadata: Callable[..., Any], source: str, tokens: list[str]) -> BackendTokenizer:
    scores = metadata("tokenizer.ggml.scores", None)
    if scores is not None and len(scores) != len(tokens):
        raise TokenizerError(f"{source}: {len(scores)} token scores for {len(tokens)} tokens")
    unknown = metadata("tokenizer.ggml.unknown_token_id", None)
    if unknown is not None and not 0 <= unknown < len(tokens):
        raise TokenizerError(f"{source}: tokenizer.ggml.unknown_token_id {unknown} is outside the vocabulary")
    gemma = str(metadata("general.architecture", "")).startswith("gemma")
    return sentencepiece_backend(tokens, scores, gemma=gemma,
                                 add_space_prefix=bool(metadata("tokenizer.ggml.add_space_prefix", True)),
                                 unknown=None if unknown is None else tokens[unknown])
