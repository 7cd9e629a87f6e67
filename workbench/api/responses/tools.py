"""A Responses request's tools as the chat route's function tools, namespaces included.

A `namespace` tool ({"type": "namespace", "name", "description", "tools": [function tools]}, which Codex
sends for its sub-agent tools) groups functions; a call names its function and, apart, its namespace.
The chat route knows only flat names, so each function of a namespace is offered as NAMESPACE__NAME (or
NAMESPACENAME where the namespace already ends in "__", as Codex's MCP namespaces `mcp__server__` do;
a name past the route's 64 characters is cut and ends in a hash of the whole), its description led by
the namespace's, and a call of such a name goes back out as a function_call item with `namespace` and
the function's own `name`; a function_call item that comes back with a `namespace` is read the same
way. Built-in tools (web_search, file_search, ...) would need the server to run them; none is served,
and each is refused by name.
"""

from __future__ import annotations

import hashlib
from typing import Any

from workbench.api.http_api import ApiError

SEPARATOR = "__"
FUNCTION_FIELDS = {"type", "name", "description", "parameters", "strict"}
LONGEST_NAME = 64  # the chat route's limit on a function name (OpenAI's)



def only(item: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(item) - allowed)
    if extra:
        raise ApiError.unsupported(f"{where}.{extra[0]}")


def flat_name(namespace: str, name: str) -> str:
    """The chat route's name of function `name` in `namespace`."""
    flat = namespace + name if namespace.endswith(SEPARATOR) else f"{namespace}{SEPARATOR}{name}"
    if len(flat) <= LONGEST_NAME:
        return flat
    digest = hashlib.sha256(flat.encode()).hexdigest()[:12]
    return f"{flat[:LONGEST_NAME - len(digest) - 1]}_{digest}"


def chat_tools(tools: object) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """(the chat route's function tools, {flat name: (namespace, name)} for the namespaced ones)."""
    if not isinstance(tools, list):
        raise ApiError.invalid("tools", "must be a list of function tools")
    out: list[dict[str, Any]] = []
    namespaced: dict[str, tuple[str, str]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            out.append(_function(tool, where))
        elif kind == "namespace":
            for function, name in _namespace(tool, where):
                out.append(function)
                namespaced[function["function"]["name"]] = (tool["name"], name)
        else:
            raise ApiError.unsupported(f"{where}.type", f"{where}: tools of type {kind!r} are not served here (function "
                                                        "and namespace tools are; in Codex, set web_search = \"disabled\")")
    return out, namespaced


def _function(tool: dict, where: str, prefix: str = "", lead: str = "") -> dict[str, Any]:
    only(tool, FUNCTION_FIELDS, where)
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    if prefix:
        function["name"] = flat_name(prefix, function["name"])
    if lead and isinstance(function.get("description", ""), str):
        function["description"] = f"{lead} {function.get('description', '')}".strip()
    return {"type": "function", "function": function}


def _namespace(tool: dict, where: str) -> list[tuple[dict[str, Any], str]]:
    """Its functions as the chat route's, each with its own name."""
    only(tool, {"type", "name", "description", "tools"}, where)
    name, inner, description = tool.get("name"), tool.get("tools"), tool.get("description")
    if not isinstance(name, str) or not name:
        raise ApiError.invalid(f"{where}.name", "must be a non-empty string")
    if not isinstance(inner, list) or not inner:
        raise ApiError.invalid(f"{where}.tools", "must be a non-empty list of function tools")
    if description is not None and not isinstance(description, str):
        raise ApiError.invalid(f"{where}.description", "must be a string")
    lead = f"({name}: {description})" if description else ""
    functions = []
    for n, function in enumerate(inner):
        at = f"{where}.tools[{n}]"
        if not isinstance(function, dict) or function.get("type") != "function":
            raise ApiError.unsupported(f"{at}.type", f"{at}: a namespace holds function tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ApiError.invalid(f"{at}.name", "must be a non-empty string")
        functions.append((_function(function, at, prefix=name, lead=lead), function["name"]))
    return functions
