"""Anthropic's Models API: GET /v1/models and GET /v1/models/{id}, in Anthropic's shape.

OpenAI's and Anthropic's SDKs list models on the same path. Anthropic's send `anthropic-version` on
every request, so a request that carries it gets Anthropic's list ({"data": [{"type": "model", "id",
"display_name", "created_at"}], "has_more", "first_id", "last_id"}) and Anthropic's errors, and takes
its key as `x-api-key` too; any other gets OpenAI's (workbench/api/openai/views.py). The served models
are few, so the list is one page whatever `limit`, `before_id` or `after_id` ask.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from workbench.api.anthropic.views import error_response
from workbench.api.http_api import ApiError, authenticate, check_model
from workbench.api.openai import views as openai_views
from workbench.serving import served_models

View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


def speaks_anthropic(request: HttpRequest) -> bool:
    return "anthropic-version" in request.headers


async def models(request: HttpRequest) -> HttpResponseBase:
    try:
        if request.method != "GET":
            raise ApiError(405, "use GET")
        await authenticate(request, api_key_header=True)
    except ApiError as exc:
        return error_response(exc)
    listed = [_model_info(name) for name in await served_models.served_from_loop()]
    return JsonResponse({"data": listed, "has_more": False, "first_id": listed[0]["id"] if listed else None,
                         "last_id": listed[-1]["id"] if listed else None})


async def model(request: HttpRequest, model_id: str) -> HttpResponseBase:
    try:
        if request.method != "GET":
            raise ApiError(405, "use GET")
        await authenticate(request, api_key_header=True)
        check_model({"model": model_id}, await served_models.served_from_loop())
    except ApiError as exc:
        return error_response(exc)
    return JsonResponse(_model_info(model_id))


def _model_info(name: str) -> dict[str, str]:
    # created_at: when the model was released, which the workbench does not know; the epoch, as OpenAI's
    # list says created 0.
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}


def by_dialect(anthropic: View, openai: View) -> View:
    """The view of the API the request speaks."""
    @csrf_exempt  # a DELETE (OpenAI's SDK's models.delete) gets the 405, not the CSRF check's HTML 403
    async def view(request: HttpRequest, *args: str, **kwargs: str) -> HttpResponseBase:
        return await (anthropic if speaks_anthropic(request) else openai)(request, *args, **kwargs)
    return view


models_view = by_dialect(models, openai_views.models)
model_view = by_dialect(model, openai_views.model)
