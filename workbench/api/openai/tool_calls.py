"""OpenAI's tools on /v1/chat/completions: the request's tools checked, shown to the model, and its
calls parsed back out of the text into `tool_calls`.

The wire format of a call is the one Hermes-style templates (Qwen2.5 and others) teach their models,
one JSON object between tags:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

- Shown: a chat template that reads `tools` (engine/loading/tokenizer.py: Tokenizer.takes_tools) renders them
  itself. One that does not (SmolLM2's) gets a system-prompt block, `system_block`, that lists the
  tools and this format, put before the first system message's text (or as a system message of its
  own); assistant messages with `tool_calls` are written back in this format and `tool` messages
  become user turns inside `<tool_response>` tags, as Qwen2.5's template renders them.
- Guaranteed: `tool_choice` "required" or a named function constrains the output with a grammar
  (engine/response_format.py, a Lark grammar with the call's JSON Schema inline), so even a small model
  returns exactly one valid call: an offered function's name and arguments that validate against
  its `parameters`. "auto" lets the model choose; "none" shows no tools.
- Ended: the engine stops at the first `</tool_call>` (SamplingParams.tool_call_end), with
  finish_reason `tool_calls`: one call per turn, whatever `parallel_tool_calls` says.
- Parsed: `parse` for a whole answer, `CallStream` for a streamed one (content deltas until a call
  starts, then the call as OpenAI's tool-call deltas once its closing tag came).
- Cut: a forced call that max_tokens (or the model's length) ends before its closing tag is still
  returned, with the arguments generated so far and finish_reason `length`, as OpenAI returns it
  (`cut`, workbench/api/openai/cut_calls.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from engine import InvalidSamplingParams, SamplingParams
from engine.response_format import ResponseFormatError, grammar_of
from workbench.api.openai import cut_calls
from workbench.protocol.request_input import BAD_PARAMS, BAD_PROMPT, InvalidInput

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # the request fields this module reads
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
# Compact JSON inside the call, as for response_format (engine/response_format.py says why).
_COMPACT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Tools:
    functions: tuple[dict[str, Any], ...]  # each {"name", "description"?, "parameters"?}, as sent
    choice: str  # "auto", "none", "required", or the one function's name the client named

    @property
    def active(self) -> bool:
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice != "auto"

    @property
    def names(self) -> set[str]:
        return {f["name"] for f in self.functions}

    def apply(self, params: SamplingParams) -> SamplingParams:
        """The request's params with the call's end marker and, when a call is forced, its grammar."""
        if not self.active:
            return params
        if self.forced and params.constrained:
            raise InvalidInput(BAD_PARAMS, "response_format cannot be combined with tool_choice "
                                           f"{self.choice!r}: the tool call's format is the response's",
                               "response_format")
        changes: dict[str, Any] = {"tool_call_end": CLOSE}
        if self.forced:
            changes["response_format"] = {"type": "grammar", "grammar": self._grammar()}
        try:
            return dataclasses.replace(params, **changes)
        except InvalidSamplingParams as exc:  # each schema compiled alone; their union did not
            raise InvalidInput(BAD_PROMPT, f"tools: the call grammar does not compile: {exc}", "tools") from None

    def _grammar(self) -> str:
        functions = [f for f in self.functions if self.choice == "required" or f["name"] == self.choice]
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                  "properties": {"name": {"const": f["name"]},
                                 "arguments": f.get("parameters") or {"type": "object"}}} for f in functions]
        schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": _COMPACT}
        return f'start: "{OPEN}\\n" call "\\n{CLOSE}"\ncall: %json {json.dumps(schema)}\n'


def tools_of(body: dict[str, Any]) -> Tools:
    """The request's tools and tool_choice, checked; a mistake is an InvalidInput naming the field."""
    raw = body.get("tools")
    functions: list[dict[str, Any]] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise InvalidInput(BAD_PROMPT, "tools must be a list of {\"type\": \"function\", \"function\": ...}",
                               "tools")
        functions = [_function(tool, f"tools[{i}]") for i, tool in enumerate(raw)]
        names = [f["name"] for f in functions]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise InvalidInput(BAD_PROMPT, f"tools: the function name {duplicate!r} is offered twice", "tools")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidInput(BAD_PROMPT, "parallel_tool_calls must be true or false", "parallel_tool_calls")
    return Tools(tuple(functions), _choice(body.get("tool_choice"), {f["name"] for f in functions}))


def _function(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidInput(BAD_PROMPT, f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
    function = tool["function"]
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise InvalidInput(BAD_PROMPT, f"{where}.function: unknown field {unknown[0]!r}", f"{where}.function")
    if not isinstance(function.get("name"), str) or not _NAME.match(function["name"]):
        raise InvalidInput(BAD_PROMPT, f"{where}.function.name must be 1-64 letters, digits, _ or -",
                           f"{where}.function.name")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise InvalidInput(BAD_PROMPT, f"{where}.function.description must be a string", f"{where}.function.description")
    parameters = function.get("parameters")
    if parameters is not None:
        try:  # the schema a forced call is constrained by: it must compile
            grammar_of({"type": "json_schema", "json_schema": {"schema": parameters}})
        except ResponseFormatError as exc:
            raise InvalidInput(BAD_PROMPT, f"{where}.function.parameters: {exc}", f"{where}.function.parameters") from None
    return {key: function[key] for key in ("name", "description", "parameters") if function.get(key) is not None}


def _choice(choice: object, names: set[str]) -> str:
    if choice is None:
        return "auto" if names else "none"
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidInput(BAD_PROMPT, 'tool_choice must be "auto", "none", "required" or '
                                           '{"type": "function", "function": {"name": ...}}', "tool_choice")
        if function["name"] not in names:
            raise InvalidInput(BAD_PROMPT, f"tool_choice names {function['name']!r}, which tools does not offer",
                               "tool_choice")
        return function["name"]
    if choice not in ("auto", "none", "required"):
        raise InvalidInput(BAD_PROMPT, 'tool_choice must be "auto", "none", "required" or a named function',
                           "tool_choice")
    if choice != "none" and not names:
        raise InvalidInput(BAD_PROMPT, f"tool_choice {choice!r} needs tools", "tool_choice")
    return str(choice)


# -- the prompt -------------------------------------------------------------------------------------

def system_block(functions: tuple[dict[str, Any], ...]) -> str:
    """What a model whose template takes no tools is told about them (docs/PROTOCOL.md shows it)."""
    listed = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    return ("You can call functions. To call one, answer with only this, nothing before or after it:\n"
            f'{OPEN}\n{{"name": <the function\'s name>, "arguments": <its arguments as a JSON object>}}\n{CLOSE}\n'
            "The functions (name, description, and the JSON Schema of the arguments):\n"
            f"{listed}")


def messages_for(messages: object, tools: Tools, template_takes_tools: bool) -> tuple[object, list | None]:
    """The messages and the `tools` argument to render them with: for a template that takes tools, the
    messages as HF templates expect them (arguments as objects); for another, in the text format above."""
    if not isinstance(messages, list):
        return messages, None  # request_input refuses it with its own message
    checked = [_message(m, i) for i, m in enumerate(messages)]
    if template_takes_tools:
        shown = [{"type": "function", "function": f} for f in tools.functions] if tools.active else None
        return checked, shown
    plain = [_as_text(m) for m in checked]
    if tools.active:
        block = system_block(tools.functions)
        if plain and isinstance(plain[0], dict) and plain[0].get("role") == "system" \
                and isinstance(plain[0].get("content"), str):
            plain[0] = {**plain[0], "content": f"{block}\n\n{plain[0]['content']}"}
        else:
            plain.insert(0, {"role": "system", "content": block})
    return plain, None


def _message(message: object, index: int) -> object:
    """An assistant message's tool_calls checked, their arguments parsed; other messages as they are."""
    if not isinstance(message, dict) or message.get("tool_calls") is None:
        return message
    where = f"messages[{index}].tool_calls"
    calls = message["tool_calls"]
    if message.get("role") != "assistant" or not isinstance(calls, list):
        raise InvalidInput(BAD_PROMPT, f"{where} must be a list, on an assistant message", where)
    parsed = []
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            raise InvalidInput(BAD_PROMPT, f"{where}[{n}] must be {{\"id\", \"type\": \"function\", \"function\": "
                                           "{\"name\", \"arguments\": a JSON string}}", f"{where}[{n}]")
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            raise InvalidInput(BAD_PROMPT, f"{where}[{n}].function.arguments is not JSON",
                               f"{where}[{n}].function.arguments") from None
        parsed.append({**call, "function": {"name": function["name"], "arguments": arguments}})
    return {**message, "tool_calls": parsed}


def _as_text(message: object) -> object:
    if not isinstance(message, dict):
        return message
    if message.get("role") == "tool":
        return {"role": "user", "content": f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"}
    if message.get("tool_calls"):
        calls = "\n".join(f"{OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}"
                          f"\n{CLOSE}" for c in message["tool_calls"])
        content = _text(message.get("content"))
        return {"role": "assistant", "content": f"{content}\n{calls}" if content else calls}
    return message


def _text(content: object) -> str:
    if isinstance(content, list):  # text parts, as request_input takes them
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


# -- the answer -------------------------------------------------------------------------------------

def _call(body: str, names: set[str]) -> dict[str, Any] | None:
    """A tool call in OpenAI's shape, or None if the block is not a call of an offered function."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names or not isinstance(value.get("arguments"), dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(value["arguments"], ensure_ascii=False)}}


def parse(text: str, tools: Tools) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a whole answer; a block that is no valid call stays in the content."""
    if not tools.active:
        return text, []
    calls, kept, at = [], [], 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), tools.names)
        if call is not None:
            calls.append(call)
            kept.append(text[at:match.start()])
            at = match.end()
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def cut(text: str, tools: Tools) -> dict[str, Any] | None:
    """The call of a forced answer `text` that stops inside its call block, arguments as far as they
    go; None when no call is forced, the text is no start of one, or its function cannot be told yet.
    For an answer that ended with `length` and no whole call."""
    if not tools.forced:
        return None
    text = text.lstrip()
    if not (text.startswith(OPEN) or OPEN.startswith(text)):
        return None
    return cut_calls.cut_call(text[len(OPEN):], tools.choice, tools.names)


class CallStream:
    """A streamed answer split into content deltas and tool calls, as the text arrives."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.calls = 0
        self._held = ""  # text that is, or may become, a call block

    def feed(self, text: str) -> list[tuple[str, Any]]:
        """("content", text) and ("call", the OpenAI call) items, in order, for the text so far."""
        if not self.tools.active:
            return [("content", text)] if text else []
        self._held += text
        out: list[tuple[str, Any]] = []
        while True:
            start = self._held.find(OPEN)
            if start < 0:
                safe = len(self._held) - _partial_open(self._held)
                self._emit(out, self._held[:safe])
                self._held = self._held[safe:]
                return out
            self._emit(out, self._held[:start])
            self._held = self._held[start:]
            match = _BLOCK.match(self._held)
            if match is None:
                return out  # the call is not complete yet
            call = _call(match.group(1), self.tools.names)
            if call is None:
                self._emit(out, match.group(0))
            else:
                out.append(("call", call))
                self.calls += 1
            self._held = self._held[match.end():]

    def deltas(self, text: str, final: bool, finish: str | None = None) -> list[dict[str, Any]]:
        """OpenAI's chat-chunk deltas for the next text: content, and for each call one delta with its
        id and name (arguments "") and one with its arguments, as OpenAI streams them. `finish`: how
        the answer ended, when `final`."""
        out: list[dict[str, Any]] = []
        at = self.calls
        for kind, value in self.feed(text) + (self.close(finish) if final else []):
            if kind == "content":
                out.append({"content": value})
                continue
            function = value["function"]
            out.append({"tool_calls": [{"index": at, "id": value["id"], "type": "function",
                                        "function": {"name": function["name"], "arguments": ""}}]})
            out.append({"tool_calls": [{"index": at, "function": {"arguments": function["arguments"]}}]})
            at += 1
        return out

    def close(self, finish: str | None = None) -> list[tuple[str, Any]]:
        """What is still held when the answer ends: text that never became a call, or a forced call cut
        by `length` (not counted in `calls`: the answer's finish_reason stays `length`)."""
        out: list[tuple[str, Any]] = []
        cut_short = cut(self._held, self.tools) if finish == "length" and not self.calls else None
        if cut_short is not None:
            out.append(("call", cut_short))
        else:
            self._emit(out, self._held)
        self._held = ""
        return out

    def _emit(self, out: list[tuple[str, Any]], text: str) -> None:
        if text and not (self.calls and not text.strip()):  # the newline after a call is no content
            out.append(("content", text))


def finish_reason(finish: str | None, has_calls: bool) -> str | None:
    """`tool_calls` exactly when the answer carries a call: the engine stops at the end marker, but
    text between tags that is no valid call is a plain stop."""
    if finish is None:
        return None
    return "tool_calls" if has_calls else "stop" if finish == "tool_calls" else finish


def _partial_open(text: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of the opening tag."""
    for length in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-length:]):
            return length
    return 0
