"""The door of an HTTP request: what its body is refused for from the request line and headers alone,
before the server has read the body, stored it, parsed it or handed it to a view.

Twisted, under Daphne, reads a whole request body into memory or a temporary file before the
application sees the request at all, and the views read and parse it before they ask for the user's
share of the input thread (workbench/serving/input_share.py). So a stranger's 10 MB body, or a user's
flood of 250 KB ones after their share was spent, cost the server their reading before the refusal.
The request class that workbench/serve.py gives Daphne (workbench/api/door_request.py) asks this door
at the request's headers and as a body without a length streams in, and answers a refusal at once,
without reading the rest. The refusals, each answered as the route answers it (below):
- 413: the body is over WORKBENCH_MAX_FRAME_BYTES (by its Content-Length, or counted as a chunked body
  arrives), on every path;
- 401: a large body (input_work.LARGE_BYTES and up) for a route that reads large bodies on the input
  thread, without a valid API token;
- 429 `rate_limited` with Retry-After: such a body while its user's share of that thread is spent or
  their queue for it full;
- 503 `unavailable` with Retry-After: such a body when its token cannot be looked up (the database
  is down): it is not let in unchecked, and the client is told to come back, as for any outage.
Each answer passes Django's middleware (settings.MIDDLEWARE) on its way out, as a view's does, so that it
carries the same headers (the security middleware's, the content-security policy, X-Frame-Options);
where the middleware answers a request itself (a Host not allowed: 400), that answer is the door's.
A body that is let in goes to the view, which checks it all again: the door only refuses before
reading what the view would refuse after reading it.

Which routes read on the input thread is said by their views, and the door finds their paths in the
URLconf (workbench/api/input_routes.py): a new path to such a view is guarded without a word here.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.base import BaseHandler
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from workbench.api.auth import api_key_token, bearer_token, user_for_token
from workbench.api.http_api import ApiError, unauthenticated
from workbench.api.input_routes import Route, route_of
from workbench.serving import input_share


def errors_of(path: str) -> str | None:
    """Whose error shape a refusal on `path` takes: its route's, the API's by prefix, or None for the
    pages (a plain text answer, as Django gives a body over its own limit)."""
    route = route_of(path)
    if route is not None:
        return route.errors
    if "/v1/messages" in path:
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai" if path.startswith("/v1/") else None


def too_large(size: int) -> ApiError | None:
    """The refusal of a body of `size` bytes (so far), as http_api.json_body refuses it, or None."""
    if size <= settings.WORKBENCH_MAX_FRAME_BYTES:
        return None
    return ApiError(413, f"request bodies are limited to {settings.WORKBENCH_MAX_FRAME_BYTES} bytes")


async def refusal_of_large(route: Route, headers: Mapping[str, str]) -> ApiError | None:
    """Whether a large body for `route` may be read: a 401 without a valid token, a 429 while its user's
    share of the input thread is spent, else None. One indexed query (the token's row), as the view's."""
    token = bearer_token(headers) or (api_key_token(headers) if route.api_key_header else None)
    user = await user_for_token(token) if token else None
    if user is None:
        return unauthenticated(route.api_key_header)
    refused = input_share.SHARES.refusal(user.get_username())
    return None if refused is None else ApiError.limit(refused)


UNAVAILABLE_RETRY_S = 5  # a database restarting or failing over is back within seconds


def unavailable() -> ApiError:
    """The refusal of a large body whose token could not be looked up."""
    return ApiError(503, "the server could not check this request's API token just now (its database did not "
                         f"answer); try again in {UNAVAILABLE_RETRY_S} s", code="unavailable", kind="server_error",
                    retry_after=UNAVAILABLE_RETRY_S)


def answer(path: str, refusal: ApiError) -> HttpResponse:
    """The refusal as the route on `path` answers it."""
    errors = errors_of(path)
    if errors == "anthropic":
        from workbench.api.anthropic.views import error_response as anthropic_error

        return anthropic_error(refusal)
    if errors == "ollama":
        from workbench.api.ollama.views import error_response as ollama_error

        return ollama_error(refusal)
    if errors == "openai":
        return refusal.response()
    return HttpResponse(refusal.message, status=refusal.status, content_type="text/plain; charset=utf-8")


class _Refused(ASGIRequest):
    """A refused request as Django's middleware sees it: no body (the door read none) and the answer the
    door has for it."""

    def __init__(self, scope: dict[str, Any], answer: HttpResponse) -> None:
        super().__init__(scope, io.BytesIO())
        self.answer = answer


class _Middleware(BaseHandler):
    """settings.MIDDLEWARE around the door's answer in place of a view (none is resolved or called)."""

    def __init__(self) -> None:
        super().__init__()
        self.load_middleware()  # sync: the door answers on the reactor's thread, within one call

    def _get_response(self, request: HttpRequest) -> HttpResponseBase:
        assert isinstance(request, _Refused)
        return request.answer


@functools.cache  # built once, as Daphne's application builds its own: 10 ms, a hundred refusals' worth
def _middleware() -> _Middleware:
    return _Middleware()


@receiver(setting_changed)
def _forget_middleware(**kwargs: object) -> None:
    """Middleware read their settings when built: a test that changes one gets a new chain."""
    _middleware.cache_clear()


def through_middleware(scope: dict[str, Any], response: HttpResponse) -> HttpResponse:
    """`response` to the request of ASGI `scope` as Django's middleware lets it out. A streamed answer
    of the middleware's own (WhiteNoise's file, for a GET of a static path with a body over the limit) is
    not sent on a refused connection: the door's own answer goes instead."""
    answered = _middleware().get_response(_Refused(scope, response))
    return answered if isinstance(answered, HttpResponse) else response
