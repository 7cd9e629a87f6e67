"""A request's `response_format` as one llguidance grammar (a JSON string), checked without a tokenizer
or a model, so an API can refuse a bad one before the request reaches an engine.

OpenAI's `{"type": "json_object"}` and `{"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}`, plus llguidance's own `{"type": "regex", "regex": ...}` and `{"type": "grammar", "grammar":
<Lark>}`; `{"type": "text"}` (or none) is no constraint. The grammar engine is llguidance (PyPI
`llguidance`): an abi3 CPU wheel with no torch dependency, what vLLM and llama.cpp use for the same job.
This module and engine/grammar.py (the token mask a grammar gives) are the only ones that import it.
Torch-free, so a web process validates requests without loading the model code.

JSON is compact (llguidance's default separators, no free whitespace): a small model that is allowed
whitespace can spend its whole token budget on newlines, and its output would then not parse.

`oneOf` is constrained as `anyOf`: a grammar cannot say "exactly one of these branches", and llguidance
refuses the keyword unless told to read it so. Agents' tool schemas use it (Qwen Code's first tool
does), where refusing it refuses every request that offers the tool. A value that matches two
branches is then possible; where the branches cannot overlap (different types or enums) nothing changes.
"""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared only in the package's stub file

# Compact JSON, and oneOf read as anyOf (the module docstring says why).
JSON_OPTIONS: "JsonCompileOptions" = {"whitespace_flexible": False, "coerce_one_of": True}


class ResponseFormatError(ValueError):
    """A response_format that is not one we serve, or whose schema, regex or grammar does not compile."""


@lru_cache(maxsize=1)
def llguidance_module() -> ModuleType:
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
        grammar = llguidance_module().LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    elif kind == "json_schema":
        grammar = _json_schema_grammar(fmt.get("json_schema"))
    elif kind == "regex":
        if not isinstance(fmt.get("regex"), str) or not fmt["regex"]:
            raise ResponseFormatError("regex must be a non-empty string")
        grammar = llguidance_module().LLMatcher.grammar_from_regex(fmt["regex"])
    else:
        if not isinstance(fmt.get("grammar"), str) or not fmt["grammar"]:
            raise ResponseFormatError("grammar must be a non-empty string in Lark syntax (llguidance's dialect)")
        grammar = llguidance_module().LLMatcher.grammar_from_lark(fmt["grammar"])
    error = llguidance_module().LLMatcher.validate_grammar(grammar)
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
        return llguidance_module().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:  # what llguidance cannot take in a schema (e.g. an integer beyond 64 bits)
        raise ResponseFormatError(f"json_schema.schema cannot be used: {exc}") from None
