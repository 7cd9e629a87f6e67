"""What the chat page keeps between loads: a system prompt and the sampling settings the page offers,
saved per conversation and as the user's default (which a new conversation starts from).

Checked by the same rules as a reply's parameters (workbench/protocol/request_input.py), so a saved setting
is always one the chat socket accepts; an unknown or bad field is refused by name and nothing is saved.
"""

from __future__ import annotations

from workbench.chat.frames import DEFAULTS, MAX_MESSAGE_CHARS
from workbench.chat.stored_text import NUL, nul_in_json, nul_refusal
from workbench.protocol import request_input
from workbench.protocol.request_input import InvalidInput

# The sampling controls on the page (templates/chat/_settings.html), and only those: the page shows
# what was saved, so a saved key it has no control for would act unseen.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed")
# What the page shows before anything was saved (an empty field: the engine's default, or no limit).
PAGE_DEFAULTS: dict[str, object] = {"temperature": 0.7, "top_p": 1, "top_k": 0}


def checked(body: object) -> tuple[str, dict[str, object]]:
    """The system prompt and sampling settings of a page's `{"system_prompt", "sampling"}` object."""
    if not isinstance(body, dict):
        raise InvalidInput("invalid_request", "the body must be a JSON object", "body")
    unknown = sorted(set(body) - {"system_prompt", "sampling"})
    if unknown:
        raise InvalidInput("invalid_request", f"{unknown[0]}: not a chat setting", unknown[0])
    system_prompt = body.get("system_prompt", "")
    if not isinstance(system_prompt, str) or len(system_prompt) > MAX_MESSAGE_CHARS:
        raise InvalidInput("invalid_request", f"system_prompt: must be text of at most {MAX_MESSAGE_CHARS} "
                                              "characters", "system_prompt")
    if (refusal := nul_refusal("system_prompt", system_prompt)) is not None:
        raise InvalidInput("invalid_request", refusal, "system_prompt")
    sampling = body.get("sampling", {})
    if not isinstance(sampling, dict):
        raise InvalidInput(request_input.BAD_PARAMS, "sampling: must be an object", "sampling")
    unknown = sorted(set(sampling) - set(SAMPLING_FIELDS))
    if unknown:
        raise InvalidInput(request_input.BAD_PARAMS, f"{unknown[0]}: not a setting the chat page offers",
                           unknown[0])
    request_input.sampling_params(sampling, DEFAULTS)  # raises, naming the field, for a bad value
    # The socket takes a NUL stop string (it stores no params); saved in jsonb it would fail the write.
    held = next((name for name, value in sampling.items() if nul_in_json(value)), None)
    if held is not None:
        raise InvalidInput(request_input.BAD_PARAMS, nul_refusal(held, NUL) or "", held)
    return system_prompt, dict(sampling)


def form_values(sampling: dict[str, object]) -> dict[str, str]:
    """The page's input values for saved settings: text, as the inputs hold it (stop comma-separated)."""
    values = {**PAGE_DEFAULTS, **sampling}
    shown = {name: "" if values.get(name) is None else str(values[name]) for name in SAMPLING_FIELDS}
    stop = values.get("stop")
    if isinstance(stop, list):
        shown["stop"] = ", ".join(str(s) for s in stop)
    return shown
