"""The operator dashboard's websocket route, /ws/ops/dashboard (workbench/asgi.py mounts it)."""

from django.urls import path

from workbench.ops.consumers import DashboardConsumer

# django-stubs types path() for Django views only; Channels' URLRouter routes ASGI apps through it.
websocket_urlpatterns = [path("ws/ops/dashboard", DashboardConsumer.as_asgi())]  # type: ignore[arg-type]
