"""ASGI entry point: `python -m daphne workbench.asgi:application`.

HTTP goes to Django; websockets pass the allowed-hosts/origin check, the session auth and the bearer
token auth before reaching their consumer. This is the production start: loading it with DEBUG off and
the development secret key is refused (workbench/secret_key.py), and so is DEBUG on while it answers any
host name beyond loopback (workbench/debug_guard.py).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workbench.settings")

from django.conf import settings  # noqa: E402  (settings must be chosen first)
from django.core.asgi import get_asgi_application  # noqa: E402

from workbench.debug_guard import refuse_debug_beyond_loopback  # noqa: E402
from workbench.secret_key import refuse_development_key  # noqa: E402

refuse_development_key(settings.DEBUG, settings.SECRET_KEY)
refuse_debug_beyond_loopback(settings.DEBUG, settings.ALLOWED_HOSTS)

django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from workbench.api.auth import BearerTokenMiddleware  # noqa: E402
from workbench.api.origin import AllowedHostsOriginValidator  # noqa: E402
from workbench.api.routing import websocket_urlpatterns as api_sockets  # noqa: E402
from workbench.chat.routing import websocket_urlpatterns as chat_sockets  # noqa: E402
from workbench.ops.routing import websocket_urlpatterns as ops_sockets  # noqa: E402

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from django.urls import re_path  # noqa: E402


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other websocket path (/ws/chat/abc, a typo): refused, where URLRouter's "No route found"
    would be a 500 and a traceback."""

    async def connect(self) -> None:
        await self.close(code=4404)


application = ProtocolTypeRouter({
    "http": django_application,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(BearerTokenMiddleware(
        # As in the routing modules: django-stubs' path()/re_path() take views, URLRouter their patterns.
        URLRouter(api_sockets + chat_sockets + ops_sockets + [re_path(r"", NoSuchSocket.as_asgi())])))),  # type: ignore[arg-type]
})
