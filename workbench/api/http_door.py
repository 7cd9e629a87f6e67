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
  thread (ROUTES), without a valid API token;
- 429 `rate_limited` with Retry-After: such a body while its user's share of that thread is spent or
  their queue for it full.
A body that is let in goes to the view, which checks it all again: the door only refuses before
reading what the view would refuse after reading it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpResponse

from workbench.api.auth import api_key_token, bearer_token, user_for_token
from workbench.api.http_api import ApiError, unauthenticated
from workbench.serving import input_share


@dataclass(frozen=True)
class Route:
    errors: str  # whose error shape: "openai", "anthropic" or "ollama"
    api_key_header: bool = False  # takes Anthropic's `x-api-key` as well as the bearer token


# The routes that read a large body on the input thread (input_work.prepared), by the end of their path:
# a root path a proxy puts in front (Daphne's root_path) changes nothing.
ROUTES = {"/v1/chat/completions": Route("openai"), "/v1/completions": Route("openai"),
          "/v1/responses": Route("openai"), "/tokenize": Route("openai"), "/detokenize": Route("openai"),
          "/v1/messages": Route("anthropic", True), "/v1/messages/count_tokens": Route("anthropic", True),
          "/api/chat": Route("ollama"), "/api/generate": Route("ollama")}


def route_of(path: str) -> Route | None:
    """The input-thread route a request's path (without its query) names, or None."""
    for end, route in ROUTES.items():
        if path.endswith(end):
            return route
    return None


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
