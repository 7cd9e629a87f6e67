"""What a client may ask of a generation, checked by one set of rules on every way in: the websocket
API (workbench/api/frames.py), the chat socket (workbench/chat/frames.py) and the OpenAI views.

The rules (docs/PROTOCOL.md, "Values"): JSON types as they are, never coerced. A boolean is `true` or
`false` (not 1, 0 or "true"); an integer is a JSON integer (not a boolean, not 4.0, not "4"); a number
is an integer or a finite float (not a boolean); `params` is an object. The value checks themselves
are SamplingParams' (engine/sampling_params.py), so the engine and every API agree by construction;
this module adds what is the same for every API around them and names one error code per kind of
mistake: `invalid_request` for the prompt or messages, `invalid_params` for a sampling parameter,
`context_length_exceeded` (OpenAI's code) for a prompt that leaves no room in the model's length.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine import InvalidSamplingParams, SamplingParams
from engine.loading.tokenizer import Tokenizer, TokenizerError
from engine.sampling_params import is_integer

BAD_PROMPT = "invalid_request"
BAD_PARAMS = "invalid_params"
TOO_LONG = "context_length_exceeded"


class InvalidInput(ValueError):
    """A refused prompt or parameter: the error code, a message for the client, and the field it names."""

    def __init__(self, code: str, message: str, param: str) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def sampling_params(values: object, defaults: Mapping[str, object] | None = None,
                    logprobs_allowed: bool = False, prompt_logprobs_allowed: bool = False) -> SamplingParams:
    """The client's `params` object as SamplingParams, over `defaults` (the API's, for keys it leaves out).
    `logprobs_allowed`: the API sends logprobs back (the websocket and OpenAI APIs; the chat page does not);
    `prompt_logprobs_allowed`: likewise the prompt's (the OpenAI API only)."""
    if not isinstance(values, dict):
        raise InvalidInput(BAD_PARAMS, "params: must be an object", "params")
    try:
        params = SamplingParams.from_dict({**(defaults or {}), **values})
    except InvalidSamplingParams as exc:
        raise InvalidInput(BAD_PARAMS, str(exc), exc.parameter) from None
    if params.logprobs is not None and not logprobs_allowed:
        raise InvalidInput(BAD_PARAMS, "logprobs: not sent over this API; leave it out", "logprobs")
    if params.prompt_logprobs is not None and not prompt_logprobs_allowed:
        raise InvalidInput(BAD_PARAMS, "prompt_logprobs: not sent over this API; leave it out", "prompt_logprobs")
    return params


def prompt(value: object) -> str | list[int]:
    """A plain prompt: text, or a list of token ids (JSON integers; `fit_vocabulary` checks their range
    once the model is known)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(is_integer(token) for token in value):
        return value
    raise InvalidInput(BAD_PROMPT, "prompt must be a string or a list of token ids", "prompt")


def fit_vocabulary(prompt: str | list[int] | None, params: SamplingParams, vocabulary: int) -> None:
    """Every token id a request names (a prompt of ids, `stop_token_ids`) within the vocabulary of the
    model that runs it, `vocabulary` ids (workbench/serving/model_facts.py). Checked at the door, where the
    error can name the field: an id past the vocabulary would otherwise reach the sampler's mask, which
    fails the forward (on CUDA, a device-side assert that poisons the process). The engine refuses the
    same again (Engine.add_request)."""
    if isinstance(prompt, list):
        for at, token in enumerate(prompt):
            if not 0 <= token < vocabulary:
                raise InvalidInput(BAD_PROMPT, f"prompt: {token} (item {at}) is not a token id of this model "
                                               f"(0 to {vocabulary - 1})", "prompt")
    try:
        params.check_vocabulary(vocabulary)
    except InvalidSamplingParams as exc:
        raise InvalidInput(BAD_PARAMS, str(exc), exc.parameter) from None


def fit_length(prompt_tokens: int, model_length: int, param: str) -> None:
    """A prompt leaves room for at least one generated token in the model's length. Checked at the door,
    so that a stream is refused with a 400 before it opens rather than failing in its first event (the
    engine refuses the same again, Intake.prompt_ids)."""
    if prompt_tokens >= model_length:
        raise InvalidInput(TOO_LONG, f"prompt has {prompt_tokens} tokens; this model's length is {model_length}, "
                                     "leaving no room to generate", param)


def chat_prompt(tokenizer: Tokenizer, messages: object, add_generation_prompt: bool = True,
                add_special_tokens: bool = False, tools: list[dict] | None = None) -> list[int]:
    """The token ids of OpenAI-shaped `messages` under the model's chat template (the tokenizer checks
    each message and says which one is wrong). `add_special_tokens`: the tokenizer's own (a BOS) on top
    of what the template writes, as vLLM's /tokenize offers; generation never asks for it. `tools`: the
    tool definitions, for a template that takes them (workbench/api/openai/tool_calls.py)."""
    if not isinstance(messages, list):
        raise InvalidInput(BAD_PROMPT, "messages must be a non-empty list of {role, content} objects", "messages")
    try:
        if add_special_tokens:
            return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt, tools))
        return tokenizer.encode_chat(messages, add_generation_prompt, tools)
    except TokenizerError as exc:
        raise InvalidInput(BAD_PROMPT, str(exc), "messages") from None


def known_token_ids(tokenizer: Tokenizer, value: object, param: str) -> list[int]:
    """A list of the model's token ids (JSON integers, each within its vocabulary), as `param`."""
    if not isinstance(value, list) or not all(is_integer(token) for token in value):
        raise InvalidInput(BAD_PROMPT, f"{param} must be a list of token ids (integers)", param)
    for at, token in enumerate(value):
        if not 0 <= token < tokenizer.vocab_size:
            raise InvalidInput(BAD_PROMPT, f"{param}[{at}]: {token} is not a token id of this model "
                                           f"(0 to {tokenizer.vocab_size - 1})", param)
    return value
