from django.contrib import admin
from django.urls import path

from workbench.api import openai_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/models", openai_views.models),
    path("v1/completions", openai_views.completions),
    path("v1/chat/completions", openai_views.chat_completions),
]
