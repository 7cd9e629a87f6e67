"""What every authenticated HTTP API view shares: OpenAI's error shape, the bearer token, the JSON body.

The OpenAI views (/v1, workbench/api/openai/views.py) and vLLM's tokenizer endpoints (/tokenize, /detokenize,
tokenize_views.py) answer errors alike, {"error": {message, type, param, code}} with a 4xx status,
read the body within WORKBENCH_MAX_FRAME_BYTES, and refuse a `model` that no worker serves (404)
and, by name, every field they do not serve.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse

from engine.loading.tokenizer import Tokenizer

from workbench.api.auth import api_key_token, bearer_token
from workbench.api.models import ApiToken
from workbench.protocol import request_input
from workbench.protocol.json_input import JsonInputError, parse_object
from workbench.serving import limits, served_models
from workbench.serving.transport import Transport

UNSUPPORTED = "unsupported_parameter"  # the code of a field this server does not serve


# The HTTP status of each error code the serving side answers with.
ERROR_STATUS = {"invalid_request": 400, "invalid_params": 400, request_input.TOO_LONG: 400, "rate_limited": 429,
                "overloaded": 503, "unavailable": 503, "timeout": 504}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.retry_after = retry_after  # seconds, sent as Retry-After (a refusal by a limit)

    @classmethod
    def refused(cls, exc: request_input.InvalidInput) -> "ApiError":
        """A 400 for what the shared rules refused, with their code, as every API answers it."""
        return cls(400, exc.message, param=exc.param, code=exc.code)

    @classmethod
    def limit(cls, refused: limits.Refused) -> "ApiError":
        """A limit's refusal (429 or 503, with Retry-After)."""
        return cls(ERROR_STATUS[refused.code], refused.message, code=refused.code,
                   kind="rate_limit_error" if refused.code == "rate_limited" else "server_error",
                   retry_after=refused.retry_after)

    @classmethod
    def invalid(cls, param: str, message: str) -> "ApiError":
        """A 400 for a field's value, "param: message", as the translated APIs word a bad one."""
        return cls(400, f"{param}: {message}", param=param, code="invalid_request")

    @classmethod
    def unsupported(cls, param: str, message: str | None = None) -> "ApiError":
        return cls(400, message or f"unsupported parameter {param!r}", param=param, code=UNSUPPORTED)

    def response(self) -> JsonResponse:
        response = JsonResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                           "code": self.code}}, status=self.status)
        if self.retry_after is not None:
            response["Retry-After"] = str(self.retry_after)
        return response


async def authenticate(request: HttpRequest, api_key_header: bool = False) -> AbstractBaseUser:
    """The user of the request's `Authorization: Bearer <token>` (or, with `api_key_header`, of its
    `x-api-key: <token>`, which Anthropic's clients send); a 401 ApiError without a valid one."""
    token = bearer_token(request.headers) or (api_key_token(request.headers) if api_key_header else None)
    user = await sync_to_async(ApiToken.user_for)(token) if token else None
    if user is None:
        raise unauthenticated(api_key_header)
    return user


def unauthenticated(api_key_header: bool = False) -> ApiError:
    """The 401 of a request without a valid token (the door's, workbench/api/http_door.py, as well)."""
    how = "x-api-key: <token> or Authorization: Bearer <token>" if api_key_header else "Authorization: Bearer <token>"
    return ApiError(401, f"a valid API token is required: {how}", code="invalid_api_key", kind="authentication_error")


def json_body(request: HttpRequest) -> dict[str, object]:
    """The request's JSON object, within the size limit (a 413 over it, a 400 for what is not one)."""
    too_large = ApiError(413, f"request bodies are limited to {settings.WORKBENCH_MAX_FRAME_BYTES} bytes")
    try:
        raw = request.body
    except RequestDataTooBig:  # past Django's own limit, which is higher than ours
        raise too_large from None
    if len(raw) > settings.WORKBENCH_MAX_FRAME_BYTES:
        raise too_large
    try:
        body = parse_object(raw, "the body")
    except JsonInputError as exc:
        raise ApiError(400, exc.message) from None
    return body


def check_model(body: Mapping[str, object], served: list[str]) -> str:
    """The served model the body's `model` names (left out: the default one); another is a 404, as
    OpenAI answers an unknown model (workbench/serving/served_models.py)."""
    try:
        return served_models.resolve(body.get("model"), served)
    except served_models.UnknownModel as exc:
        if exc.not_a_string:
            raise ApiError(400, exc.message, param="model") from None
        raise ApiError(404, exc.message, param="model", code="model_not_found") from None


def tokenizer_of(transport: Transport, model: str) -> Tokenizer:
    """The tokenizer of a served model, or a 503 when this process cannot read it."""
    try:
        return served_models.tokenizer_of(transport, model)
    except served_models.TokenizerUnreadable as exc:
        raise ApiError(503, exc.message, param="model", code="unavailable", kind="server_error") from None


def vocabulary_of(model: str) -> int:
    """The vocabulary size of a served model, or a 503 when this process cannot read its config."""
    try:
        return served_models.vocabulary_of(model)
    except served_models.TokenizerUnreadable as exc:
        raise ApiError(503, exc.message, param="model", code="unavailable", kind="server_error") from None


def refuse_unless_off(body: Mapping[str, object], off: Mapping[str, object]) -> None:
    """Fields clients send that this server does not serve, each accepted only as its "off" value (of
    that JSON type: `false` is not `0`) or null, and refused by name otherwise, never silently ignored."""
    for name, value in off.items():
        sent = body.get(name)
        if sent is not None and not (type(sent) is type(value) and sent == value):
            raise ApiError.unsupported(name, f"{name} is not supported here; leave it out or send "
                                             f"{json.dumps(value)}")
