from django.urls import path

from workbench.api.consumers import GenerateConsumer

websocket_urlpatterns = [path("ws/v1/generate", GenerateConsumer.as_asgi())]
