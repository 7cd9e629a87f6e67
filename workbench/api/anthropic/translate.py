"""Anthropic's Messages request, translated into the chat-completions body that the OpenAI route
serves (workbench/api/openai/views.py), so that one set of rules checks both and one path serves them.

    system (a string or text blocks)          -> a first "system" message
    messages' text blocks                     -> the message's text, blocks joined with newlines
    a "system" message among the messages     -> a "system" message in its place (Claude Code sends them)
    an assistant's tool_use blocks            -> its `tool_calls` (arguments: the input as JSON)
    an assistant's thinking blocks            -> left out: no model here reads earlier turns' thinking
                                                 (Anthropic leaves them out for most models too)
    a user's tool_result blocks               -> "tool" messages, before the user's text (with
                                                 is_error, the content after "Error: ")
    max_tokens, temperature, top_p, top_k     -> the same fields
    stop_sequences                            -> stop
    tools [{name, description, input_schema}] -> function tools, input_schema as their parameters (a
                                                 tool with `defer_loading` is offered as any other:
                                                 nothing here searches for tools, so the model sees it)
    tool_choice auto / any / tool / none      -> "auto" / "required" / the named function / "none"
    output_config.format (a JSON Schema)      -> response_format json_schema
    seed (our extension)                      -> seed

Every other field, block type or value is refused by name (a 400 ApiError), never silently ignored;
options.py checks the options that change nothing here (thinking, context_management, effort,
metadata, cache_control) and says why each is accepted. `tool_choice.disable_parallel_tool_use` is
accepted too: one call per turn always.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.api.anthropic import options
from workbench.api.http_api import ApiError

# The Messages fields; count_tokens takes the prompt's part of them.
PROMPT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control", "context_management",
                 "output_config"}
MESSAGE_FIELDS = PROMPT_FIELDS | {"max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "metadata",
                                  "stream", "seed"}
SAMPLING = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "seed": "seed", "stop_sequences": "stop"}
# A chat-completions field the shared checks name -> the Messages field it came from.
PARAM_NAMES = {"stop": "stop_sequences", "tools": "tools", "tool_choice": "tool_choice",
               "response_format": "output_config.format"}


def chat_body(body: dict[str, Any], count_only: bool = False) -> dict[str, Any]:
    """The chat-completions body serving a Messages body (`count_only`: a count_tokens body, which
    carries no sampling fields)."""
    known = PROMPT_FIELDS if count_only else MESSAGE_FIELDS
    for name in body:
        if name not in known:
            raise ApiError.unsupported(name)
    if not count_only and body.get("max_tokens") is None:
        raise ApiError(400, "max_tokens: Field required", param="max_tokens")
    options.check_thinking(body.get("thinking"))
    options.check_context_management(body.get("context_management"))
    options.check_cache_control(body.get("cache_control"), "cache_control")
    options.check_metadata(body.get("metadata"))
    response_format = options.response_format(body.get("output_config"))
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    chat: dict[str, Any] = {"messages": _system(body.get("system")) + _messages(body.get("messages"))}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    for name, field in SAMPLING.items():
        if body.get(name) is not None:
            chat[field] = body[name]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def renamed(exc: ApiError) -> ApiError:
    """The shared checks' error, naming the Messages field rather than the chat-completions one."""
    if exc.param in PARAM_NAMES:
        exc.param = PARAM_NAMES[exc.param]
        exc.message = exc.message.replace("stop:", "stop_sequences:", 1) if exc.param == "stop_sequences" else exc.message
    return exc


def _system(system: object) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if not isinstance(system, list):
        raise ApiError.invalid("system", "must be a string or a list of text blocks")
    texts = [_text_block(block, f"system[{i}]") for i, block in enumerate(system)]
    return [{"role": "system", "content": "\n".join(texts)}]


def _messages(messages: object) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError.invalid("messages", "must be a non-empty list of {role, content} objects")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise ApiError.invalid(where, 'must be {"role": "user", "assistant" or "system", "content": ...}')
        allowed = {"role", "content"} | ({"output_config"} if message["role"] == "system" else set())
        if set(message) - allowed:
            raise ApiError.unsupported(f"{where}.{sorted(set(message) - allowed)[0]}")
        content = message.get("content")
        if "output_config" in message:  # a turn's own effort (options.py)
            options.check_turn_output_config(message["output_config"], f"{where}.output_config")
            if content is None:
                continue
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list) and content and message["role"] == "system":
            out.append({"role": "system", "content": "\n".join(_text_block(block, f"{where}.content[{n}]")
                                                              for n, block in enumerate(content))})
        elif isinstance(content, list) and content:
            out += _assistant(content, where) if message["role"] == "assistant" else _user(content, where)
        else:
            raise ApiError.invalid(f"{where}.content", "must be a string or a non-empty list of content blocks")
    if not out:
        raise ApiError.invalid("messages", "must hold at least one message with content")
    if out[-1]["role"] == "assistant":
        # Anthropic continues a final assistant message ("prefill"); the chat template opens a new turn.
        raise ApiError.unsupported(f"messages[{len(messages) - 1}]", "a final assistant message (prefilling the "
                                   "reply) is not supported here; end with a user message")
    return out


def _user(blocks: list, where: str) -> list[dict[str, Any]]:
    """A user's blocks: its tool results as "tool" messages (Anthropic puts them first), then its text."""
    results, texts = [], []
    for n, block in enumerate(blocks):
        at = f"{where}.content[{n}]"
        if isinstance(block, dict) and block.get("type") == "tool_result":
            results.append(_tool_result(block, at))
        else:
            texts.append(_text_block(block, at))
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts else [])


def _assistant(blocks: list, where: str) -> list[dict[str, Any]]:
    texts, calls = [], []
    for n, block in enumerate(blocks):
        at = f"{where}.content[{n}]"
        if isinstance(block, dict) and block.get("type") == "tool_use":
            calls.append(_tool_use(block, at))
        elif isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking"):
            _fields(block, {"thinking", "signature"} if block["type"] == "thinking" else {"data"}, at)
            continue  # not part of the prompt (the module's docstring says why)
        else:
            texts.append(_text_block(block, at))
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    return [{**message, "tool_calls": calls} if calls else message]


def _fields(block: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(block) - allowed - {"type", "cache_control"})
    if extra:
        raise ApiError.unsupported(f"{where}.{extra[0]}")
    options.check_cache_control(block.get("cache_control"), f"{where}.cache_control")


def _text_block(block: object, where: str) -> str:
    if not isinstance(block, dict):
        raise ApiError.invalid(where, 'must be a content block like {"type": "text", "text": "..."}')
    if block.get("type") != "text":
        raise ApiError.unsupported(f"{where}.type", f"{where}: content blocks of type {block.get('type')!r} are not "
                                                    "supported here (text, tool_use and tool_result are)")
    _fields(block, {"text", "citations"}, where)
    if block.get("citations") is not None:
        raise ApiError.unsupported(f"{where}.citations")
    if not isinstance(block.get("text"), str):
        raise ApiError.invalid(f"{where}.text", "must be a string")
    return block["text"]


def _tool_use(block: dict, where: str) -> dict[str, Any]:
    _fields(block, {"id", "name", "input"}, where)
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
            or not isinstance(block.get("input"), dict):
        raise ApiError.invalid(where, 'a tool_use block is {"type": "tool_use", "id": str, "name": str, "input": object}')
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}}


def _tool_result(block: dict, where: str) -> dict[str, Any]:
    _fields(block, {"tool_use_id", "content", "is_error"}, where)
    if not isinstance(block.get("tool_use_id"), str):
        raise ApiError.invalid(f"{where}.tool_use_id", "must be a string")
    content = block.get("content")
    if isinstance(content, list):
        content = "\n".join(_text_block(part, f"{where}.content[{n}]") for n, part in enumerate(content))
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise ApiError.invalid(f"{where}.content", "must be a string or a list of text blocks")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise ApiError.invalid(f"{where}.is_error", "must be true or false")
    # The model reads a failed call's result as one: the text says so.
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": f"Error: {content}" if is_error else content}


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ApiError.invalid("tools", "must be a list of {name, description, input_schema}")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError.invalid(where, "must be {name, description, input_schema}")
        if tool.get("type") not in (None, "custom"):
            raise ApiError.unsupported(f"{where}.type", f"{where}: server tools ({tool.get('type')!r}) are not "
                                                         "supported here; offer client tools {name, input_schema}")
        _fields(tool, {"name", "description", "input_schema", "defer_loading"}, where)
        if tool.get("defer_loading") is not None and not isinstance(tool["defer_loading"], bool):
            raise ApiError.invalid(f"{where}.defer_loading", "must be true or false")
        if not isinstance(tool.get("input_schema"), dict):
            raise ApiError.invalid(f"{where}.input_schema", "must be a JSON Schema object")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: object) -> object:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise ApiError.invalid("tool_choice", 'must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} '
                                  'or {"type": "none"}')
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if choice["type"] == "tool" else set())
    if set(choice) - allowed:
        raise ApiError.unsupported(f"tool_choice.{sorted(set(choice) - allowed)[0]}")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError.invalid("tool_choice.disable_parallel_tool_use", "must be true or false")
    if choice["type"] == "tool":
        if not isinstance(choice.get("name"), str):
            raise ApiError.invalid("tool_choice.name", "must name one of the tools")
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice["type"]]
