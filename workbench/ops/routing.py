from django.urls import path

from workbench.ops.consumers import DashboardConsumer

websocket_urlpatterns = [path("ws/ops/dashboard", DashboardConsumer.as_asgi())]
