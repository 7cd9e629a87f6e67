from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from workbench.accounts import login, signup
from workbench.api import reproduce_views, server_views, tokenize_views, unknown_routes
from workbench.api.anthropic import models as anthropic_models
from workbench.api.anthropic import views as anthropic_views
from workbench.api.ollama import views as ollama_views
from workbench.api.openai import views as openai_views
from workbench.api.openai.openapi import openapi_json
from workbench.api.responses import views as responses_views
from workbench.chat import conversation_views as chat_manage
from workbench.chat import reproduce_views as chat_reproduce
from workbench.chat import views as chat
from workbench.ops import metrics as ops_metrics
from workbench.ops import views as ops

urlpatterns = [
    path("", chat.conversations, name="conversations"),
    path("c/<int:conversation_id>", chat.conversation, name="conversation"),
    path("c/<int:conversation_id>/rename", chat_manage.rename, name="rename_conversation"),
    path("c/<int:conversation_id>/delete", chat_manage.delete, name="delete_conversation"),
    path("c/<int:conversation_id>/export.md", chat_manage.export_markdown, name="export_markdown"),
    path("c/<int:conversation_id>/export.json", chat_manage.export_json, name="export_json"),
    path("c/<int:conversation_id>/versions/<int:message_id>", chat_manage.show_version, name="show_version"),
    path("c/<int:conversation_id>/settings", chat_manage.save_settings, name="conversation_settings"),
    path("c/<int:conversation_id>/replies/<int:message_id>/reproduce", chat_reproduce.reproduce,
         name="reproduce_reply"),
    path("settings/chat-defaults", chat_manage.save_defaults, name="chat_defaults"),
    path("tokens", chat.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", chat.revoke_token, name="revoke_token"),
    path("signup", signup.signup, name="signup"),
    path("login", login.LoginPage.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("v1/models", anthropic_models.models_view),  # OpenAI's list, or Anthropic's to its SDKs
    path("v1/models/<path:model_id>", anthropic_models.model_view),
    path("v1/completions", openai_views.completions),
    path("v1/chat/completions", openai_views.chat_completions),
    path("v1/reproduce/<str:request_id>", reproduce_views.reproduce),
    path("v1/messages", anthropic_views.messages),
    path("v1/responses", responses_views.responses),
    path("v1/responses/<str:response_id>", responses_views.response),
    path("v1/messages/count_tokens", anthropic_views.count_tokens),
    path("api/chat", ollama_views.chat),
    path("api/generate", ollama_views.generate),
    path("api/tags", ollama_views.tags),
    path("api/show", ollama_views.show),
    path("api/ps", ollama_views.running),
    path("api/version", ollama_views.version),
    path("openapi.json", openapi_json, name="openapi"),
    path("health", server_views.health, name="health"),
    path("version", server_views.version, name="version"),
    path("tokenize", tokenize_views.tokenize, name="tokenize"),
    path("detokenize", tokenize_views.detokenize, name="detokenize"),
    path("ops/flags", ops.flags, name="ops_flags"),
    path("ops/dashboard", ops.dashboard, name="ops_dashboard"),
    path("metrics", ops_metrics.metrics, name="metrics"),
    path("v1/<path:rest>", unknown_routes.openai_not_found),
    path("api/<path:rest>", unknown_routes.ollama_not_found),
]
