"""The chat page's websocket route, /ws/chat/<id> (workbench/asgi.py mounts it)."""

from django.urls import path

from workbench.chat.consumers import ChatConsumer

# django-stubs types path() for Django views only; Channels' URLRouter routes ASGI apps through it.
websocket_urlpatterns = [path("ws/chat/<int:conversation_id>", ChatConsumer.as_asgi())]  # type: ignore[arg-type]
