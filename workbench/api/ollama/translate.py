"""Ollama's /api/chat and /api/generate requests, translated into the OpenAI routes' bodies
(workbench/api/openai/views.py), so one set of rules checks them and one path serves them.

    model ("demo" or "demo:latest")        -> model
    /api/chat messages                      -> messages (an assistant's tool_calls' arguments as JSON
                                              text; a "tool" message's tool_name dropped, the text kept)
    /api/generate prompt, system            -> a chat of [system, user] (the model's chat template), or
                                              with `raw: true` the prompt as it is (a plain completion)
    options.num_predict                     -> max_tokens (-1 or -2: up to the model's length)
    options.temperature, top_p, top_k, min_p, seed, stop, presence_penalty, frequency_penalty
                                            -> the same fields
    options.repeat_penalty                  -> repetition_penalty
    format "json" or a JSON Schema          -> response_format
    tools                                   -> tools (/api/chat)

Every other field or option is refused by name (a 400), never silently ignored; `keep_alive` is
accepted (the model stays loaded whatever it says), `think` only as false.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.api.http_api import ApiError

COMMON = {"model", "stream", "options", "format", "keep_alive", "think"}
CHAT_FIELDS = COMMON | {"messages", "tools"}
GENERATE_FIELDS = COMMON | {"prompt", "system", "raw"}
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
           "min_p": "min_p", "seed": "seed", "stop": "stop", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty", "repeat_penalty": "repetition_penalty"}
# A field the shared checks name -> the Ollama field it came from.
PARAM_NAMES = {value: f"options.{key}" for key, value in OPTIONS.items()}


def model_name(model: object) -> object:
    """Ollama's names carry a tag; the one tag of a served model is `latest`."""
    return model.removesuffix(":latest") if isinstance(model, str) else model


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    _check(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content}", param="messages")
    chat = {**_common(body), "messages": [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]}
    if body.get("tools") is not None:
        chat["tools"] = body["tools"]  # OpenAI's shape already; the chat route checks it
    return chat


def generate_body(body: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(raw, the body): a raw prompt goes to the completions route as it is, any other through the chat
    template, as Ollama renders it."""
    _check(body, GENERATE_FIELDS)
    prompt, system, raw = body.get("prompt"), body.get("system"), body.get("raw")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string", param="prompt")
    if system is not None and not isinstance(system, str):
        raise ApiError(400, "system must be a string", param="system")
    if raw is not None and not isinstance(raw, bool):
        raise ApiError(400, "raw must be true or false", param="raw")
    if raw:
        if system is not None:
            raise ApiError.unsupported("system", "system applies through the chat template; with raw: true, "
                                                 "write it into the prompt")
        return True, {**_common(body), "prompt": prompt}
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return False, {**_common(body), "messages": messages}


def renamed(exc: ApiError) -> ApiError:
    if exc.param in PARAM_NAMES:
        exc.message = exc.message.replace(f"{exc.param}:", f"{PARAM_NAMES[exc.param]}:", 1)
        exc.param = PARAM_NAMES[exc.param]
    return exc


def _check(body: dict[str, Any], known: set[str]) -> None:
    for name in body:
        if name not in known:
            raise ApiError.unsupported(name)
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    if body.get("think") not in (None, False):
        raise ApiError.unsupported("think", "think is not supported here; leave it out or send false")


def _common(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    if body.get("model") is not None:
        chat["model"] = model_name(body["model"])
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "options must be an object", param="options")
    for name, value in (options or {}).items():
        if name not in OPTIONS:
            raise ApiError.unsupported(f"options.{name}", f"option {name!r} is not supported here")
        if value is not None:
            chat[OPTIONS[name]] = value
    if chat.get("max_tokens") in (-1, -2):  # Ollama's "no limit" and "fill the context"
        chat["max_tokens"] = None
    fmt = body.get("format")
    if fmt == "json":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise ApiError(400, 'format must be "json" or a JSON Schema object', param="format")
    return chat


def _message(message: object, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be {{role, content}}", param=where)
    extra = sorted(set(message) - {"role", "content", "tool_calls", "tool_name", "images", "thinking"})
    if extra:
        raise ApiError.unsupported(f"{where}.{extra[0]}")
    for name in ("images", "thinking"):
        if message.get(name):
            raise ApiError.unsupported(f"{where}.{name}", f"{where}.{name}: not supported here")
    out = {"role": message.get("role"), "content": message.get("content")}
    if message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  for c in calls):
            raise ApiError(400, f"{where}.tool_calls must be a list of {{function: {{name, arguments}}}}",
                           param=f"{where}.tool_calls")
        out["tool_calls"] = [{"id": f"call_{n}", "type": "function",
                              "function": {"name": c["function"].get("name"),
                                           "arguments": json.dumps(c["function"].get("arguments") or {})}}
                             for n, c in enumerate(calls)]
    return out
