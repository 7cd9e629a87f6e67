"""The `usage` object of OpenAI's responses, from a finished stream event's engine usage.

The engine's usage (engine/outputs.py:Usage, as the websocket API's `done.usage` carries it) names the
prompt tokens found in the prefix cache `cached_tokens`; OpenAI nests that count under
`prompt_tokens_details`, which its clients read (`usage.prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations


def openai_usage(usage: dict | None) -> dict | None:
    if usage is None:
        return None
    plain = {key: value for key, value in usage.items() if key != "cached_tokens"}
    return {**plain, "prompt_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)}}
