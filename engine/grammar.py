"""Structured output: a request's `response_format` as a grammar, and the per-row token mask it gives.

The grammar engine is llguidance (PyPI `llguidance`): an abi3 CPU wheel with no torch dependency that
computes a mask over the whole vocabulary in tens of microseconds per token, and is what vLLM and
llama.cpp use for the same job. This module is the only one that imports it.

- `grammar_of(response_format)`: OpenAI's `{"type": "json_object"}` and `{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}}`, plus llguidance's own `{"type": "regex", "regex": ...}`
  and `{"type": "grammar", "grammar": <Lark>}`, as one llguidance grammar (a JSON string), checked
  without a tokenizer so an API can refuse a bad one before the request reaches an engine.
  `{"type": "text"}` (or none) is no constraint.
- `GrammarTokenizer`: llguidance's view of our tokenizer (engine/loading/tokenizer.py, also a GGUF's rebuilt
  one): the same `tokenizers` backend, serialized, over the model's logits width, with the model's EOS
  ids as the tokens that end a grammar. Building it costs ~0.5 s, so an engine builds it once, on the
  first constrained request.
- `Constraint`: one request's matcher. `apply(logits_row)` sets every token the grammar forbids to
  -inf (EOS only where the grammar accepts); `advance(token)` commits the sampled token.

JSON is compact (llguidance's default separators, no free whitespace): a small model that is allowed
whitespace can spend its whole token budget on newlines, and its output would then not parse.
"""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.kernels.host_copy import device_tensor
from engine.loading.tokenizer import Tokenizer

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions  # declared only in the package's stub file

# Compact JSON (the module docstring says why).
JSON_OPTIONS: "JsonCompileOptions" = {"whitespace_flexible": False}


class ResponseFormatError(ValueError):
    """A response_format that is not one we serve, or whose schema, regex or grammar does not compile."""


@lru_cache(maxsize=1)
def _llguidance() -> ModuleType:
    """Imported on the first constrained request, not with the engine: a machine without the package
    (the GPU image, tests/test_gpu_check_script.py) still serves everything else, and a request that
    needs it is told why it cannot be served."""
    try:
        return importlib.import_module("llguidance")
    except ImportError:
        raise ResponseFormatError("structured output needs the llguidance package on the server "
                                  "(pip install llguidance)") from None


def grammar_of(response_format: object) -> str | None:
    """The llguidance grammar of a response_format; None for plain text. Raises ResponseFormatError."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ResponseFormatError("must be an object like {\"type\": \"json_object\"}")
    try:
        key = json.dumps(response_format, allow_nan=False)
    except (TypeError, ValueError):
        raise ResponseFormatError("must be plain JSON") from None
    # Cached by its JSON (key order kept: llguidance writes properties in the schema's order): the API checks a
    # request's format, then the engine compiles it. A format that fails is cached too, with its reason: a
    # client resending a schema that does not compile costs one compile, not one a request.
    grammar, refusal = _grammar_or_refusal(key)
    if refusal is not None:
        raise ResponseFormatError(refusal)
    return grammar


@lru_cache(maxsize=256)
def _grammar_or_refusal(key: str) -> tuple[str | None, str | None]:
    try:
        return _grammar(key), None
    except ResponseFormatError as exc:
        return None, str(exc)


def _grammar(key: str) -> str | None:
    fmt = json.loads(key)
    kind = fmt.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"},
               "regex": {"type", "regex"}, "grammar": {"type", "grammar"}}
    if kind not in allowed:
        raise ResponseFormatError(f"type must be one of {', '.join(sorted(allowed))}, got {kind!r}")
    extra = sorted(set(fmt) - allowed[kind])
    if extra:
        raise ResponseFormatError(f"unknown field {extra[0]!r} for type {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        grammar = _llguidance().LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    elif kind == "json_schema":
        grammar = _json_schema_grammar(fmt.get("json_schema"))
    elif kind == "regex":
        if not isinstance(fmt.get("regex"), str) or not fmt["regex"]:
            raise ResponseFormatError("regex must be a non-empty string")
        grammar = _llguidance().LLMatcher.grammar_from_regex(fmt["regex"])
    else:
        if not isinstance(fmt.get("grammar"), str) or not fmt["grammar"]:
            raise ResponseFormatError("grammar must be a non-empty string in Lark syntax (llguidance's dialect)")
        grammar = _llguidance().LLMatcher.grammar_from_lark(fmt["grammar"])
    error = _llguidance().LLMatcher.validate_grammar(grammar)
    if error:
        raise ResponseFormatError(f"does not compile: {error.strip()}")
    return grammar


def _json_schema_grammar(spec: object) -> str:
    if not isinstance(spec, dict):
        raise ResponseFormatError("json_schema must be an object like {\"name\": ..., \"schema\": {...}}")
    extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if extra:
        raise ResponseFormatError(f"json_schema: unknown field {extra[0]!r}")
    if "name" in spec and not isinstance(spec["name"], str):
        raise ResponseFormatError("json_schema.name must be a string")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ResponseFormatError("json_schema.strict must be true or false")
    # OpenAI lets `schema` be left out (any JSON object); strict or not, the output follows the schema here.
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise ResponseFormatError("json_schema.schema must be a JSON Schema object")
    try:
        return _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:  # what llguidance cannot take in a schema (e.g. an integer beyond 64 bits)
        raise ResponseFormatError(f"json_schema.schema cannot be used: {exc}") from None


class GrammarTokenizer:
    """llguidance's tokenizer over ours: the same vocabulary, the model's logits width and EOS ids."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.ll = _llguidance().LLTokenizer(tokenizer.backend_json(), n_vocab=vocab_size,
                                         eos_token=sorted(eos_token_ids))

    def constraint(self, grammar: str) -> "Constraint":
        return Constraint(_llguidance().LLMatcher(self.ll, grammar, log_level=0), self.vocab_size)


class Constraint:
    """One request's grammar state: which tokens may come next, advanced by each committed token."""

    def __init__(self, matcher: "llguidance.LLMatcher", vocab_size: int) -> None:
        if matcher.is_error():
            raise ResponseFormatError(f"does not compile for this tokenizer: {matcher.get_error()}")
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)  # bit i of word w: token 32w+i

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar allows next."""
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        # Little-endian words (x86, arm64): byte b of the buffer holds tokens 8b..8b+7, lowest bit first.
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[: self.vocab_size]
        return bits.view(np.bool_)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] with every token the grammar forbids at -inf (a new tensor). On the CPU in numpy:
        a handful of torch ops over the row cost 40 times more on a busy machine (bench/structured.py)."""
        forbidden = ~self.allowed()
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            row = logits.numpy().copy()
            row[forbidden] = -np.inf
            return torch.from_numpy(row)
        return logits.masked_fill(device_tensor(torch.from_numpy(forbidden), logits.device, torch.bool), float("-inf"))

    def advance(self, token: int) -> None:
        """Commit the sampled token. A token the mask allowed is always accepted; `error` says otherwise."""
        self.matcher.consume_token(token)

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing more (its EOS included, once consumed)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None
