from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from workbench.api import openai_views, server_views, tokenize_views
from workbench.api.openapi import openapi_json
from workbench.chat import views as chat
from workbench.ops import metrics as ops_metrics
from workbench.ops import views as ops

urlpatterns = [
    path("", chat.conversations, name="conversations"),
    path("c/<int:conversation_id>", chat.conversation, name="conversation"),
    path("tokens", chat.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", chat.revoke_token, name="revoke_token"),
    path("signup", chat.signup, name="signup"),
    path("login", auth_views.LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("v1/models", openai_views.models),
    path("v1/completions", openai_views.completions),
    path("v1/chat/completions", openai_views.chat_completions),
    path("openapi.json", openapi_json, name="openapi"),
    path("health", server_views.health, name="health"),
    path("version", server_views.version, name="version"),
    path("tokenize", tokenize_views.tokenize, name="tokenize"),
    path("detokenize", tokenize_views.detokenize, name="detokenize"),
    path("ops/flags", ops.flags, name="ops_flags"),
    path("ops/dashboard", ops.dashboard, name="ops_dashboard"),
    path("metrics", ops_metrics.metrics, name="metrics"),
]
