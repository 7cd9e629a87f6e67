"""vLLM's tokenizer endpoints: POST /tokenize and POST /detokenize, with a served model's tokenizer (the
body's `model`, else the default one: workbench/serving/served_models.py).

Request and response shapes are vLLM's (vllm/entrypoints/openai/protocol.py: TokenizeCompletionRequest,
TokenizeChatRequest, TokenizeResponse, DetokenizeRequest, DetokenizeResponse), so its clients work:

    /tokenize    {"prompt": str, "add_special_tokens": true}
                 {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false}
                 -> {"tokens": [int], "count": int, "max_model_len": int}
    /detokenize  {"tokens": [int]} -> {"prompt": str}

Authenticated, limited per user (tokenize_limit.py), bodies read and errors answered as on /v1
(http_api.py); prompts, messages and token ids are checked by the shared rules (request_input.py). The
tokenizer is the transport's, the one the web side renders chat prompts with; `max_model_len` is the
model's length, which is what both transports' engines serve (neither sets a shorter one), read as the
chat's fitting reads it. Detokenize keeps special tokens, as vLLM's does, so a /tokenize result comes
back whole.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from engine.loading.tokenizer import Tokenizer
from workbench.api import tokenize_limit
from workbench.api.http_api import ApiError, authenticate, check_model, json_body, refuse_unless_off, tokenizer_of
from workbench.api.input_routes import input_route
from workbench.protocol import request_input
from workbench.serving import bridge, input_work, limits, served_models
from workbench.serving.model_facts import model_length

TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"}
DETOKENIZE_FIELDS = {"model", "tokens"}
# vLLM's fields this server does not serve, accepted only when off.
TOKENIZE_OFF_ONLY: dict[str, object] = {"return_token_strs": False, "continue_final_message": False}


def tokenize_body(tokenizer: Tokenizer, body: Mapping[str, object]) -> list[int]:
    """The token ids a /tokenize body asks for; ApiError for a body vLLM's shapes do not allow."""
    _refuse_unknown(body, TOKENIZE_FIELDS | TOKENIZE_OFF_ONLY.keys())
    refuse_unless_off(body, TOKENIZE_OFF_ONLY)
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise ApiError(400, "send prompt (text) or messages (a conversation), exactly one",
                       param="messages" if messages is not None else "prompt", code=request_input.BAD_PROMPT)
    try:
        if messages is not None:
            return request_input.chat_prompt(tokenizer, messages, _flag(body, "add_generation_prompt", True),
                                             _flag(body, "add_special_tokens", False))
        if "add_generation_prompt" in body:
            raise ApiError.unsupported("add_generation_prompt", "add_generation_prompt applies to messages only")
        if not isinstance(prompt, str):
            raise request_input.InvalidInput(request_input.BAD_PROMPT, "prompt must be a string", "prompt")
        return tokenizer.encode(prompt, add_special_tokens=_flag(body, "add_special_tokens", True))
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None


def detokenize_body(tokenizer: Tokenizer, body: Mapping[str, object]) -> str:
    """The text of a /detokenize body's token ids, special tokens kept; ApiError for a bad body."""
    _refuse_unknown(body, DETOKENIZE_FIELDS)
    try:
        tokens = request_input.known_token_ids(tokenizer, body.get("tokens"), "tokens")
    except request_input.InvalidInput as exc:
        raise ApiError.refused(exc) from None
    return tokenizer.decode(tokens, skip_special_tokens=False)


def _refuse_unknown(body: Mapping[str, object], known: set[str]) -> None:
    for name in body:
        if name not in known:
            raise ApiError.unsupported(name)


def _flag(body: Mapping[str, object], name: str, default: bool) -> bool:
    """A boolean field: true or false (the shared rule: not 1, not "true"); null or absent is `default`."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise request_input.InvalidInput(request_input.BAD_PROMPT, f"{name} must be true or false", name)
    return value


Answer = Callable[[Tokenizer, str, Mapping[str, object]], dict[str, object]]  # (tokenizer, its model, body)
AsyncView = Callable[[HttpRequest], Coroutine[object, None, HttpResponse]]  # what path() takes of an async view


def _view(answer: Answer) -> AsyncView:
    """A POST view: authenticate, read the body, check the model, answer with the transport's tokenizer."""

    async def view(request: HttpRequest) -> HttpResponse:
        try:
            if request.method != "POST":
                raise ApiError(405, "use POST")
            user = await authenticate(request)
            await tokenize_limit.check(user.pk)
            body = json_body(request)
            model = check_model(body, await served_models.served_from_loop())
            transport = await bridge.transport_from_loop()
            # A 250 KB prompt takes about 90 ms to tokenize: not on the event loop (input_work.py).
            return JsonResponse(await input_work.prepared(len(request.body), user.get_username(), answer,
                                                          tokenizer_of(transport, model), model, body))
        except limits.Refused as exc:
            return ApiError.limit(exc).response()
        except ApiError as exc:
            return exc.response()

    return csrf_exempt(view)


def _tokenized(tokenizer: Tokenizer, model: str, body: Mapping[str, object]) -> dict[str, object]:
    tokens = tokenize_body(tokenizer, body)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": model_length(model)}


def _detokenized(tokenizer: Tokenizer, model: str, body: Mapping[str, object]) -> dict[str, object]:
    return {"prompt": detokenize_body(tokenizer, body)}


tokenize = input_route("openai")(_view(_tokenized))
detokenize = input_route("openai")(_view(_detokenized))
