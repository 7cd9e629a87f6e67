"""The API's websocket route, /ws/v1/generate (workbench/asgi.py mounts it)."""

from django.urls import path

from workbench.api.consumers import GenerateConsumer

# django-stubs types path() for Django views only; Channels' URLRouter routes ASGI apps through it.
websocket_urlpatterns = [path("ws/v1/generate", GenerateConsumer.as_asgi())]  # type: ignore[arg-type]
