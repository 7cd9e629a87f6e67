"""Tokenizer: HF `tokenizer.json` through the `tokenizers` library, plus the Jinja chat template.

Encode, decode and chat rendering follow what HF transformers does with the same files, because
clients compare our token counts and prompts with theirs. The chat template is untrusted text from a
checkpoint, so it renders in Jinja's immutable sandbox, as HF does.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.nodes
import jinja2.parser
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as BackendTokenizer

from engine.loading.json_files import read_json_object
from engine.loading.token_bytes import vocabulary_bytes


class TokenizerError(ValueError):
    """Tokenizer files or a chat request that cannot be used, with the reason."""


class ChatTemplateError(TokenizerError):
    """The chat template refused the conversation (raise_exception) or failed to render."""


# HF's `clean_up_tokenization` pairs, applied on decode only when tokenizer_config.json asks for it.
# Texts from this length on are encoded with the GIL released (Tokenizer.encode says why); shorter ones
# the direct way, which costs less per call.
GIL_FREE_ENCODE_CHARS = 4096
_CLEANUP_PAIRS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                  (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


# A base model (Gemma 3 270M) continues text: it can serve completions, not conversations.
NO_CHAT_TEMPLATE = ("this model has no chat template (it is a base model that continues text, not a chat "
                    "model); send a plain prompt, as a completion, instead of messages")


class Tokenizer:
    def __init__(self, backend: BackendTokenizer, config: dict[str, Any], chat_template: str | None) -> None:
        self._backend = backend
        self._config = config
        self.chat_template = chat_template
        # Every special token the config names (bos_token, eos_token, pad_token, ...) reaches the chat
        # template under its own name, as in HF.
        self.special_tokens = {key: _token_text(value) for key, value in config.items()
                               if key.endswith("_token") and isinstance(_token_text(value), str)}
        self.bos_token = self.special_tokens.get("bos_token")
        self.eos_token = self.special_tokens.get("eos_token")
        # transformers 5 never applies the space clean-up to BPE tokenizers (it would corrupt text
        # such as "a , b"); we do the same so decoded text matches theirs.
        is_bpe = type(backend.model).__name__ == "BPE"
        self._cleanup = bool(config.get("clean_up_tokenization_spaces", False)) and not is_bpe

    @classmethod
    def from_dir(cls, path: Path) -> "Tokenizer":
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"{path}: tokenizer.json is missing")
        try:
            backend = BackendTokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust library raises plain Exception on a malformed file
            raise TokenizerError(f"{tokenizer_file}: not a valid tokenizers file ({exc})") from exc
        config_file = path / "tokenizer_config.json"
        config = {}
        if config_file.is_file():
            try:
                config = read_json_object(config_file)
            except ValueError as exc:
                raise TokenizerError(str(exc)) from exc
        return cls(backend, config, _find_chat_template(path, config))

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def backend_json(self) -> str:
        """The `tokenizers` backend serialized, for libraries that rebuild it (engine/grammar.py)."""
        return self._backend.to_str()

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template reads a `tools` variable (HF's convention for tool definitions)."""
        return self.chat_template is not None and "tools" in self.chat_template

    @property
    def thinks(self) -> bool:
        """Whether the chat template knows `<think>` blocks (Qwen3's, DeepSeek-R1's): the model's replies
        may open with its reasoning there, which the API layers give apart (workbench/api/reasoning.py)."""
        return self.chat_template is not None and "<think>" in self.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (JSON's \\ud800): the backend raises a bare TypeError
            raise TokenizerError(f"the text is not valid Unicode: a lone surrogate at character {exc.start}") from None
        if len(text) < GIL_FREE_ENCODE_CHARS:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        # tokenizers' encode holds the GIL for the whole text (a 250 KB prompt: about 90 ms, in which no
        # other thread of the process runs, the engine's included); encode_batch releases it, same ids.
        return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self._backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
        if self._cleanup:
            for before, after in _CLEANUP_PAIRS:
                text = text.replace(before, after)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes `token_id` stands for (engine/loading/token_bytes.py), even where its text alone is a
        broken character."""
        piece = self._backend.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id not in self._added_token_ids:
            known = vocabulary_bytes(piece, self._byte_level)
            if known is not None:
                return known
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @cached_property
    def _added_token_ids(self) -> frozenset[int]:
        return frozenset(self._backend.get_added_tokens_decoder())

    @cached_property
    def _byte_level(self) -> bool:
        return "ByteLevel" in str(self._backend.decoder)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for a conversation, rendered by the checkpoint's chat template (`tools`: the
        OpenAI-shaped tool definitions, for a template that takes them)."""
        if self.chat_template is None:
            raise TokenizerError(NO_CHAT_TEMPLATE)
        messages = _plain_messages(messages)
        context = {"bos_token": "", "eos_token": "", **self.special_tokens}
        try:
            return self._compiled_template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, documents=None,
                **context,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:  # the template is checkpoint code: any failure is the template's
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a conversation. The template writes any BOS itself, so the tokenizer must not
        add special tokens again (a second BOS would change what the model sees)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools), add_special_tokens=False)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        assert self.chat_template is not None  # apply_chat_template refuses a model without one first
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not parse: {exc}") from exc


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's signature; Jinja's own tojson escapes HTML characters, which would change prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in HF; for
    rendering a prompt it is just its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_template_error(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _plain_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages checked, each content as one string: OpenAI's text parts
    ([{"type": "text", "text": ...}]) joined with newlines (as vLLM does), an assistant's null content
    (a message that only calls tools) as "". Other parts (images, audio) are refused: this reads text."""
    if not isinstance(messages, list) or not messages:
        raise TokenizerError("messages must be a non-empty list of {role, content} objects")
    plain = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TokenizerError(f"messages[{index}] must be an object with role and content")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise TokenizerError(f"messages[{index}].role must be a non-empty string")
        content = message.get("content")
        if content is None and message["role"] == "assistant":
            content = ""
        elif isinstance(content, list):
            texts = []
            for n, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise TokenizerError(f"messages[{index}].content[{n}] must be a text part "
                                         '{"type": "text", "text": "..."}: this model reads text only')
                texts.append(part["text"])
            content = "\n".join(texts)
        elif not isinstance(content, str):
            raise TokenizerError(f"messages[{index}].content must be a string or a list of text parts")
        plain.append({**message, "content": content})
    return plain


def _find_chat_template(path: Path, config: dict[str, Any]) -> str | None:
    # HF keeps the template in tokenizer_config.json (a string, or a list of named templates of which
    # "default" is used) or, in newer checkpoints, in chat_template.jinja beside it.
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    return template
