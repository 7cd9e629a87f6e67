"""OpenAI's Responses request, translated into the chat-completions body that the chat route serves
(workbench/api/openai/views.py), so one set of rules checks both and one path serves them.

    instructions                          -> a first "system" message (not carried to a follow-up)
    input: a string                       -> one user message
    input: message items (role, content)  -> messages; "developer" is "system"; input_text and
                                             output_text parts joined with newlines
    input: function_call items            -> an assistant message's tool_calls
    input: function_call_output items     -> "tool" messages
    input: reasoning items                -> left out: no model here reads earlier turns' reasoning (a
                                             thinking model's chat template drops it too)
    previous_response_id                  -> the stored conversation (the earlier input and output) first
    max_output_tokens                     -> max_tokens
    temperature, top_p, top_k, seed       -> the same fields (top_k and seed: our extensions)
    tools: function and namespace tools   -> function tools (tools.py)
    tool_choice, parallel_tool_calls      -> the same
    text.format text/json_object/json_schema -> response_format

Every other field, item type, part type or value is refused by name (a 400 ApiError), never silently
ignored. `metadata` (kept with a stored response), `user`, `store` and `truncation: "disabled"` are
accepted; so are `prompt_cache_key` and `safety_identifier` (strings), which leave nothing to do here:
the prefix cache finds a conversation's blocks by their tokens, within the user's own scope. Codex
sends these with every request, each accepted with nothing to do:
- `reasoning` {effort, summary}: a thinking model's reasoning comes as a reasoning item whatever they
  say, and no model here takes an effort;
- `include: ["reasoning.encrypted_content"]`: a reasoning item carries no encrypted_content, since
  reasoning sent back is left out of the prompt (above); no other include is served;
- `client_metadata` (string values): the caller's own records.
`stream` says how the reply is sent.
"""

from __future__ import annotations

from typing import Any

from workbench.api.http_api import ApiError
from workbench.api.responses import tools as request_tools
from workbench.api.responses.tools import only as _only

FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "seed", "tools",
          "tool_choice", "parallel_tool_calls", "text", "stream", "store", "previous_response_id", "metadata", "user",
          "truncation", "include", "reasoning", "prompt_cache_key", "safety_identifier", "client_metadata"}
INCLUDES = {"reasoning.encrypted_content"}
EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = (None, "auto", "concise", "detailed")
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
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)
                                or not set(include) <= INCLUDES):
        raise ApiError.unsupported("include", f"include: only {sorted(INCLUDES)} is served; leave it out or send []")
    _reasoning(body.get("reasoning"))
    for name, most in (("metadata", 16), ("client_metadata", None)):
        value = body.get(name)
        if value is not None and (not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
                                  or (most is not None and len(value) > most)):
            raise ApiError(400, f"{name} must be an object of {f'up to {most} ' if most else ''}string values",
                           param=name)
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
        message = _item(item, f"input[{i}]")
        if message is not None:
            messages.append(message)
    return messages


def chat_body(body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """The chat-completions body serving this Responses body over `messages`, and its namespaced
    functions ({the chat route's name: (namespace, name)}, tools.py)."""
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
    namespaced: dict[str, tuple[str, str]] = {}
    if body.get("tools") is not None:
        chat["tools"], namespaced = request_tools.chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat, namespaced


def renamed(exc: ApiError) -> ApiError:
    """The shared checks' error, naming the Responses field rather than the chat-completions one."""
    if exc.param in PARAM_NAMES:
        exc.message = exc.message.replace(f"{exc.param}:", f"{PARAM_NAMES[exc.param]}:", 1)
        exc.param = PARAM_NAMES[exc.param]
    return exc


def _reasoning(reasoning: object) -> None:
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise ApiError.invalid("reasoning", 'must be an object like {"effort": "medium", "summary": "auto"}')
    _only(reasoning, {"effort", "summary", "generate_summary"}, "reasoning")
    if reasoning.get("effort") not in EFFORTS:
        raise ApiError.invalid("reasoning.effort", f"must be one of {', '.join(e for e in EFFORTS if e)}")
    for name in ("summary", "generate_summary"):
        if reasoning.get(name) not in SUMMARIES:
            raise ApiError.invalid(f"reasoning.{name}", f"must be one of {', '.join(s for s in SUMMARIES if s)}")


def _item(item: object, where: str) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        raise ApiError.invalid(where, "must be an item object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _only(item, {"type", "role", "content", "id", "status"}, where)
        role = {"developer": "system"}.get(item.get("role"), item.get("role"))  # type: ignore[arg-type]
        if role not in ("user", "system", "assistant"):
            raise ApiError.invalid(f"{where}.role", 'must be "user", "system", "developer" or "assistant"')
        return {"role": role, "content": _content(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        _only(item, {"type", "call_id", "name", "namespace", "arguments", "id", "status"}, where)
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise ApiError.invalid(where, "a function_call item has call_id, name and arguments (a JSON string)")
        if item.get("namespace") is not None and not isinstance(item["namespace"], str):
            raise ApiError.invalid(f"{where}.namespace", "must be a string")
        name = request_tools.flat_name(item["namespace"], item["name"]) if item.get("namespace") else item["name"]
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": item["arguments"]}}]}
    if kind == "reasoning":
        _only(item, {"type", "id", "summary", "content", "encrypted_content", "status"}, where)
        if not isinstance(item.get("summary", []), list) or not isinstance(item.get("content") or [], list) \
                or not isinstance(item.get("encrypted_content") or "", str):
            raise ApiError.invalid(where, "a reasoning item has summary and content (lists) and encrypted_content (a string)")
        return None  # not part of the prompt (the module's docstring says why)
    if kind == "function_call_output":
        _only(item, {"type", "call_id", "output", "id", "status"}, where)
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            raise ApiError.invalid(where, "a function_call_output item has call_id and output (a string)")
        return {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
    raise ApiError.unsupported(f"{where}.type", f"{where}: items of type {kind!r} are not supported here "
                                               "(message, function_call, function_call_output and "
                                               "reasoning are)")


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError.invalid(where, "must be a string or a list of input_text parts")
    texts = []
    for n, part in enumerate(content):
        at = f"{where}[{n}]"
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
            kind = part.get("type") if isinstance(part, dict) else None
            raise ApiError.unsupported(f"{at}.type", f"{at}: parts of type {kind!r} are not supported here "
                                                     "(input_text and output_text are)")
        _only(part, {"type", "text", "annotations", "logprobs"}, at)
        if not isinstance(part.get("text"), str):
            raise ApiError.invalid(f"{at}.text", "must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_choice(choice: object) -> object:
    if isinstance(choice, str):
        return choice  # the chat route checks the value
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) <= {"type", "name"}:
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ApiError.invalid("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}')


def _format(text: object) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise ApiError.invalid("text", 'must be an object like {"format": {...}}')
    if text.get("verbosity") not in (None, "medium"):
        raise ApiError.unsupported("text.verbosity", 'text.verbosity: only "medium" (the default) is supported')
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError.invalid("text.format", 'must be {"type": "text"}, {"type": "json_object"} or '
                                  '{"type": "json_schema", "name": ..., "schema": {...}}')
    if fmt["type"] == "json_schema":
        _only(fmt, {"type", "name", "schema", "strict", "description"}, "text.format")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if fmt.get(k) is not None}}
    _only(fmt, {"type"}, "text.format")
    return {"type": fmt["type"]}
