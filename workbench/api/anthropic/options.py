"""The Messages request's options that shape how a model thinks and what it answers in, checked here;
translate.py carries what they change into the chat-completions body.

Claude Code sends all of them on every request, so each value a client may send is either served or
refused by name:
- `thinking`: {"type": "disabled"}, or {"type": "adaptive"} (optionally with `display`), which leaves
  thinking to the model: a thinking model's reasoning still comes as a thinking block (reply.py), and
  a model that does not think answers without one, as Claude does when it decides not to think.
  {"type": "enabled", "budget_tokens": N} asks for thinking whatever the model, so it is refused.
- `context_management`: edits that clear earlier turns' thinking (`clear_thinking_*`) ask for what
  already happens here: no model here reads earlier thinking blocks, so they never reach the prompt
  (translate.py). Every other edit (`clear_tool_uses_*`: clearing tool results past a trigger) is
  refused by name, as nothing here would do it.
- `output_config`: `effort` (low, medium, high, xhigh, max) steers how much Claude thinks; no model
  here has such a setting, so it changes nothing, on the request or on a system message among the
  turns (which may carry `output_config` {effort} alone, with or without content). `format`
  {"type": "json_schema", "schema"}: the answer is JSON matching the schema, served as the chat
  route's `response_format`.
- `metadata` {"user_id"} is the caller's own record; `cache_control` asks for what the prefix cache
  does unasked (docs/OPERATIONS.md).
"""

from __future__ import annotations

from typing import Any

from workbench.api.http_api import ApiError

EFFORTS = ("low", "medium", "high", "xhigh", "max")
THINKING_DISPLAYS = ("summarized", "omitted")



def check_thinking(thinking: object) -> None:
    if thinking is None:
        return
    if isinstance(thinking, dict) and thinking.get("type") == "disabled" and set(thinking) == {"type"}:
        return
    if isinstance(thinking, dict) and thinking.get("type") == "adaptive" and set(thinking) <= {"type", "display"}:
        if thinking.get("display") not in (None, *THINKING_DISPLAYS):
            raise ApiError.invalid("thinking.display", f"must be one of {', '.join(THINKING_DISPLAYS)}")
        return
    raise ApiError.unsupported("thinking", 'thinking on request is not supported here; leave it out or send '
                                           '{"type": "adaptive"} (a thinking model still thinks) or {"type": "disabled"}')


def check_context_management(management: object) -> None:
    if management is None:
        return
    if not isinstance(management, dict) or set(management) - {"edits"} or not isinstance(management.get("edits", []), list):
        raise ApiError.invalid("context_management", 'must be an object like {"edits": [{"type": "clear_thinking_20251015"}]}')
    for i, edit in enumerate(management.get("edits", [])):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not isinstance(kind, str):
            raise ApiError.invalid(f"context_management.edits[{i}]", 'must be an object like {"type": "clear_thinking_20251015"}')
        if set(edit) - {"type", "keep"}:
            raise ApiError.unsupported(f"context_management.edits[{i}].{sorted(set(edit) - {'type', 'keep'})[0]}")
        if not kind.startswith("clear_thinking_"):
            raise ApiError.unsupported(f"context_management.edits[{i}].type",
                                       f"context_management.edits[{i}]: {kind!r} edits are not supported here "
                                       "(earlier thinking is never kept in the prompt: clear_thinking edits are)")


def check_metadata(metadata: object) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
        raise ApiError.invalid("metadata", 'must be an object like {"user_id": "..."}')
    if metadata.get("user_id") is not None and not isinstance(metadata["user_id"], str):
        raise ApiError.invalid("metadata.user_id", "must be a string")


def check_cache_control(cache_control: object, where: str) -> None:
    if cache_control is not None and not isinstance(cache_control, dict):
        raise ApiError.invalid(where, 'must be an object like {"type": "ephemeral"}')


def check_turn_output_config(output_config: object, where: str) -> None:
    """A system message's own `output_config`: an effort alone (the format is the request's only)."""
    if not isinstance(output_config, dict):
        raise ApiError.invalid(where, 'must be an object like {"effort": "high"}')
    if set(output_config) - {"effort"}:
        raise ApiError.unsupported(f"{where}.{sorted(set(output_config) - {'effort'})[0]}")
    if output_config.get("effort") not in (None, *EFFORTS):
        raise ApiError.invalid(f"{where}.effort", f"must be one of {', '.join(EFFORTS)}")


def response_format(output_config: object) -> dict[str, Any] | None:
    """The chat route's `response_format` that `output_config` asks for, or None (checked either way)."""
    if output_config is None:
        return None
    if not isinstance(output_config, dict):
        raise ApiError.invalid("output_config", 'must be an object like {"effort": "high"}')
    if set(output_config) - {"effort", "format"}:
        raise ApiError.unsupported(f"output_config.{sorted(set(output_config) - {'effort', 'format'})[0]}")
    if output_config.get("effort") not in (None, *EFFORTS):
        raise ApiError.invalid("output_config.effort", f"must be one of {', '.join(EFFORTS)}")
    schema_format = output_config.get("format")
    if schema_format is None:
        return None
    if not isinstance(schema_format, dict) or schema_format.get("type") != "json_schema" \
            or set(schema_format) != {"type", "schema"} or not isinstance(schema_format["schema"], dict):
        raise ApiError.invalid("output_config.format", 'must be {"type": "json_schema", "schema": a JSON Schema object}')
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema_format["schema"]}}
