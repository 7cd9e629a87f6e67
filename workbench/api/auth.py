"""Bearer-token authentication for API clients: `Authorization: Bearer <token>`, on websockets (as
ASGI middleware in front of the session auth) and on the HTTP API; Anthropic's `x-api-key: <token>`
header on the Messages API, whose clients send the key that way."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from workbench.api.models import ApiToken


def bearer_token(headers) -> str | None:
    """From ASGI scope headers (a list of byte pairs) or a Django request's headers (a mapping)."""
    items = headers.items() if hasattr(headers, "items") else headers
    for name, value in items:
        name = name.decode("latin-1") if isinstance(name, bytes) else name
        if name.lower() == "authorization":
            # latin-1 decodes any bytes: a header that is not UTF-8 is just a token that matches nobody.
            value = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def api_key_token(headers) -> str | None:
    """The `x-api-key` header of a Django request's headers, as Anthropic's clients send their key."""
    value = headers.get("x-api-key")
    return value.strip() if isinstance(value, str) and value.strip() else None


@database_sync_to_async
def user_for_token(token: str):
    return ApiToken.user_for(token)


class BearerTokenMiddleware:
    """Inside AuthMiddlewareStack: a bearer token, when sent, decides scope["user"] (an invalid or
    revoked one means anonymous); otherwise the session's user stands. scope["bearer_token"] (the token
    itself) says which: an API token is for generating, and sockets meant for people (the dashboard)
    refuse it; every socket checks it again for every frame (workbench/protocol/socket_access.py), so a
    revocation reaches open sockets."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope, receive, send):
        token = bearer_token(scope.get("headers", []))
        if token is not None:
            scope = {**scope, "user": await user_for_token(token) or AnonymousUser(), "bearer_token": token}
        return await self.inner(scope, receive, send)
