"""llama.cpp server's `timings` object, which open-webui reads for its tokens-per-second display.

llama.cpp's server puts it at the top of a whole reply and of the last streamed chunk; the field names
are its own: `cache_n` (prompt tokens found cached), `prompt_n` (prompt tokens computed), `prompt_ms`,
`prompt_per_token_ms`, `prompt_per_second`, `predicted_n` (generated tokens), `predicted_ms`,
`predicted_per_token_ms`, `predicted_per_second`. Ours come from the engine's per-request timings
(engine/outputs.py: timings_of): the prompt's time runs from the request's first scheduling to its first
token (a prefill in chunks included), the prediction's from the first token to the last, and, as in
llama.cpp, the generated tokens all count against the prediction's time.
"""

from __future__ import annotations


def _rate(count: int, ms: float) -> float | None:
    return count / ms * 1000 if ms > 0 else None


def _per_token(count: int, ms: float) -> float | None:
    return ms / count if count > 0 else None


def llama_timings(usage: dict | None, timings: dict | None) -> dict | None:
    """The object from a finished event's engine usage and timings; None without them (a failed request)."""
    if not usage or not timings or timings.get("time_to_first_token") is None:
        return None
    first_token, queued = timings["time_to_first_token"], timings.get("queue_time") or 0.0
    prompt_ms = max(first_token - queued, 0.0) * 1000
    predicted_ms = max(timings["total_time"] - first_token, 0.0) * 1000
    cached = usage.get("cached_tokens", 0)
    prompt_n, predicted_n = usage["prompt_tokens"] - cached, usage["completion_tokens"]
    return {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": _per_token(prompt_n, prompt_ms), "prompt_per_second": _rate(prompt_n, prompt_ms),
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": _per_token(predicted_n, predicted_ms),
            "predicted_per_second": _rate(predicted_n, predicted_ms)}
