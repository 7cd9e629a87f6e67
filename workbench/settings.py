"""Django settings, from the environment; the defaults are the embedded single-process workbench.

WORKBENCH_SECRET_KEY, WORKBENCH_DEBUG, WORKBENCH_ALLOWED_HOSTS (comma-separated), WORKBENCH_DB_PATH
(SQLite file), WORKBENCH_MODEL ("demo" or a model directory), WORKBENCH_DEVICE, WORKBENCH_DTYPE,
WORKBENCH_MAX_FRAME_BYTES, WORKBENCH_STATIC_ROOT. The engine's own ARC_* flags are read by the engine.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")


DEBUG = _env_bool("WORKBENCH_DEBUG", True)
# The default key is for the embedded development server only; a deployment sets its own.
SECRET_KEY = os.environ.get("WORKBENCH_SECRET_KEY", "workbench-development-key-not-for-deployment")
ALLOWED_HOSTS = [h for h in os.environ.get("WORKBENCH_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "workbench.api",
    "workbench.chat",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "conversations"
LOGOUT_REDIRECT_URL = "login"

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Daphne serves no static files; WhiteNoise lets the app serve its own assets (no CDN, works offline).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "workbench.urls"
ASGI_APPLICATION = "workbench.asgi.application"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [BASE_DIR / "templates"],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("WORKBENCH_DB_PATH", str(BASE_DIR / "workbench.sqlite3"))}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Deployments set WORKBENCH_STATIC_ROOT and run `manage.py collectstatic`; unset, nothing is collected.
STATIC_ROOT = os.environ.get("WORKBENCH_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True  # the embedded default serves straight from static/ without collectstatic
USE_TZ = True
TIME_ZONE = "UTC"

WORKBENCH_MODEL = os.environ.get("WORKBENCH_MODEL", "demo")
WORKBENCH_DEVICE = os.environ.get("WORKBENCH_DEVICE", "cpu")
WORKBENCH_DTYPE = os.environ.get("WORKBENCH_DTYPE", "float32")
# Limits on what one websocket frame or HTTP body may carry.
WORKBENCH_MAX_FRAME_BYTES = int(os.environ.get("WORKBENCH_MAX_FRAME_BYTES", 256 * 1024))
