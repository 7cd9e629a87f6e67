"""OpenAI's Responses request, translated into the chat-completions body that the chat route serves
(workbench/api/openai/views.py), so one set of rules checks both and one path serves them.

    instructions                          -> a first "system" message (not carried to a follow-up)
    input: a string                       -> one user message
    input: message items (role, content)  -> messages; "developer" is "system"; input_text and
                                             output_text parts joined with newlines
    input: function_call items            -> an assistant message's tool_calls
    input: function_call_output items     -> "tool" messages
    previous_response_id                  -> the stored conversation (the earlier input and output) first
    max_output_tokens                     -> max_tokens
    temperature, top_p, top_k, seed       -> the same fields (top_k and seed: our extensions)
    tools [{type: function, name, ...}]   -> function tools
    tool_choice, parallel_tool_calls      -> the same
    text.format text/json_object/json_schema -> response_format

Every other field, item type, part type or value is refused by name (a 400 ApiError), never silently
ignored. `metadata` (kept with a stored response), `user`, `store`, `truncation: "disabled"`,
`include: []` and `reasoning: null` are accepted; so are `prompt_cache_key` and `safety_identifier`
(strings; Codex sends the first with every request), which leave nothing to do here: the prefix cache
finds a conversation's blocks by their tokens, within the user's own scope. `stream` says how the
reply is sent.
"""

from __future__ import annotations

from typing import Any

from workbench.api.http_api import ApiError

FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "seed", "tools",
          "tool_choice", "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "metadata", "user",
          "truncation", "include", "reasoning", "prompt_cache_key", "safety_identifier"}
SAMPLING = {"max_output_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "seed": "seed", "parallel_tool_calls": "parallel_tool_calls"}
# A chat-completions field the shared checks name -> the Responses field it came from.
PARAM_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}


def check(body: dict[str, Any]) -> str | None:
    """The fields that are the Responses API's own, before anything is translated; the
    previous_response_id, if any."""
    for name in body:
        if name not in FIELDS:
            raise ApiError.unsupported(name)
    for name in ("stream", "store"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise ApiError(400, f"{name} must be true or false", param=name)
    if body.get("truncation") not in (None, "disabled"):
        raise ApiError.unsupported("truncation", 'truncation: only "disabled" is supported')
    if body.get("include") not in (None, []):
        raise ApiError.unsupported("include", "include: no extra output is served; leave it out or send []")
    if body.get("reasoning") is not None:
        raise ApiError.unsupported("reasoning", "reasoning is not supported here; leave it out or send null")
    metadata = body.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict)
                                 or not all(isinstance(v, str) for v in metadata.values()) or len(metadata) > 16):
        raise ApiError(400, "metadata must be an object of up to 16 string values", param="metadata")
    for name in ("user", "prompt_cache_key", "safety_identifier"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise ApiError(400, f"{name} must be a string", param=name)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise ApiError(400, "previous_response_id must be a string", param="previous_response_id")
    return previous


def conversation(body: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of the conversation so far: the earlier stored ones, then this input's."""
    raw = body.get("input")
    if isinstance(raw, str):
        return earlier + [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "input must be a string or a non-empty list of items", param="input")
    messages = list(earlier)
    for i, item in enumerate(raw):
        messages.append(_item(item, f"input[{i}]"))
    return messages


def chat_body(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body serving this Responses body over `messages`."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", param="instructions")
    chat: dict[str, Any] = {"messages": ([{"role": "system", "content": instructions}] if instructions else [])
                            + messages}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    for name, field in SAMPLING.items():
        if body.get(name) is not None:
            chat[field] = body[name]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def renamed(exc: ApiError) -> ApiError:
    """The shared checks' error, naming the Responses field rather than the chat-completions one."""
    if exc.param in PARAM_NAMES:
        exc.message = exc.message.replace(f"{exc.param}:", f"{PARAM_NAMES[exc.param]}:", 1)
        exc.param = PARAM_NAMES[exc.param]
    return exc


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code="invalid_request")


def _item(item: object, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise _bad(where, "must be an item object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _only(item, {"type", "role", "content", "id", "status"}, where)
        role = {"developer": "system"}.get(item.get("role"), item.get("role"))  # type: ignore[arg-type]
        if role not in ("user", "system", "assistant"):
            raise _bad(f"{where}.role", 'must be "user", "system", "developer" or "assistant"')
        return {"role": role, "content": _content(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        _only(item, {"type", "call_id", "name", "arguments", "id", "status"}, where)
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise _bad(where, "a function_call item has call_id, name and arguments (a JSON string)")
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}]}
    if kind == "function_call_output":
        _only(item, {"type", "call_id", "output", "id", "status"}, where)
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            raise _bad(where, "a function_call_output item has call_id and output (a string)")
        return {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
    raise ApiError.unsupported(f"{where}.type", f"{where}: items of type {kind!r} are not supported here "
                                               "(message, function_call and function_call_output are)")


def _only(item: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(item) - allowed)
    if extra:
        raise ApiError.unsupported(f"{where}.{extra[0]}")


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of input_text parts")
    texts = []
    for n, part in enumerate(content):
        at = f"{where}[{n}]"
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
            kind = part.get("type") if isinstance(part, dict) else None
            raise ApiError.unsupported(f"{at}.type", f"{at}: parts of type {kind!r} are not supported here "
                                                     "(input_text and output_text are)")
        _only(part, {"type", "text", "annotations", "logprobs"}, at)
        if not isinstance(part.get("text"), str):
            raise _bad(f"{at}.text", "must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list of function tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ApiError.unsupported(f"{where}.type", f"{where}: tools of type {kind!r} are not supported here "
                                                        "(function tools are)")
        _only(tool, {"type", "name", "description", "parameters", "strict"}, where)
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")
                                                      if tool.get(k) is not None}})
    return out


def _tool_choice(choice: object) -> object:
    if isinstance(choice, str):
        return choice  # the chat route checks the value
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) <= {"type", "name"}:
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise _bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}')


def _format(text: object) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise _bad("text", 'must be an object like {"format": {...}}')
    if text.get("verbosity") not in (None, "medium"):
        raise ApiError.unsupported("text.verbosity", 'text.verbosity: only "medium" (the default) is supported')
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad("text.format", 'must be {"type": "text"}, {"type": "json_object"} or '
                                  '{"type": "json_schema", "name": ..., "schema": {...}}')
    if fmt["type"] == "json_schema":
        _only(fmt, {"type", "name", "schema", "strict", "description"}, "text.format")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if fmt.get(k) is not None}}
    _only(fmt, {"type"}, "text.format")
    return {"type": fmt["type"]}
