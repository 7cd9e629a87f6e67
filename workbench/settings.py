"""Django settings, from the environment; the defaults are the embedded single-process workbench.

WORKBENCH_SECRET_KEY, WORKBENCH_DEBUG, WORKBENCH_ALLOWED_HOSTS (comma-separated), DATABASE_URL (any
database dj-database-url reads, e.g. postgres://...; unset: SQLite at WORKBENCH_DB_PATH), WORKBENCH_MODEL
("demo" or a model directory), WORKBENCH_DEVICE, WORKBENCH_DTYPE, WORKBENCH_MAX_FRAME_BYTES,
WORKBENCH_STATIC_ROOT; the transport: WORKBENCH_TRANSPORT ("inprocess" or "celery"), REDIS_URL,
WORKBENCH_QUEUE_PREFIX, WORKBENCH_WORKER_CAPACITY, WORKBENCH_HEARTBEAT_S, WORKBENCH_WORKER_LOST_S,
WORKBENCH_DRAIN_S.
docs/OPERATIONS.md says what each is for. The engine's own ARC_* flags are read by the engine.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import dj_database_url

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
    "workbench.ops",
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

_SQLITE_URL = "sqlite:///" + os.environ.get("WORKBENCH_DB_PATH", str(BASE_DIR / "workbench.sqlite3"))
DATABASES = {"default": dj_database_url.parse(os.environ.get("DATABASE_URL") or _SQLITE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# "inprocess": the engine on a thread of this process (the embedded default). "celery": requests go to
# Celery GPU workers over Redis, and tokens come back through the channels-redis layer.
WORKBENCH_TRANSPORT = os.environ.get("WORKBENCH_TRANSPORT", "inprocess")
if WORKBENCH_TRANSPORT not in ("inprocess", "celery"):
    raise ValueError(f"WORKBENCH_TRANSPORT must be inprocess or celery, not {WORKBENCH_TRANSPORT!r}")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# The consumers' own layer stays in memory even with the Celery transport: the transport keeps a
# channels-redis layer of its own (workbench/serving/wire.py), so a Redis outage ends requests with a
# clear error instead of crashing every open websocket in Channels' dispatch loop.
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Every worker's Celery queue is <prefix>.<worker id>; several deployments can share one Redis.
WORKBENCH_QUEUE_PREFIX = os.environ.get("WORKBENCH_QUEUE_PREFIX", "workbench")
if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", WORKBENCH_QUEUE_PREFIX):
    raise ValueError("WORKBENCH_QUEUE_PREFIX must be 1-32 letters, digits, '-' or '_'")
# Requests (running + waiting) one worker accepts before the web side answers "overloaded".
WORKBENCH_WORKER_CAPACITY = int(os.environ.get("WORKBENCH_WORKER_CAPACITY", 256))
# A worker publishes its heartbeat every HEARTBEAT_S; one silent for WORKER_LOST_S is lost, and its
# requests end with an error.
WORKBENCH_HEARTBEAT_S = float(os.environ.get("WORKBENCH_HEARTBEAT_S", 1.0))
WORKBENCH_WORKER_LOST_S = float(os.environ.get("WORKBENCH_WORKER_LOST_S", 4.0))
# On a warm shutdown (SIGTERM) a worker takes nothing new and gives what it holds this long to finish.
WORKBENCH_DRAIN_S = float(os.environ.get("WORKBENCH_DRAIN_S", 30))

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
# GGUF models: "quantized" or "dequantized" weights; unset, the engine's default for the device.
WORKBENCH_WEIGHTS = os.environ.get("WORKBENCH_WEIGHTS") or None
# Tokens a request's deltas gather before they go out (workbench/serving/stream_interval.py): 1 sends
# every step's tokens; N sends N times fewer messages, for servers where per-message cost dominates.
# The first tokens and the last event always go at once. Read by the process that runs the engine.
_stream_interval = os.environ.get("WORKBENCH_STREAM_INTERVAL", "1")
if not re.fullmatch(r"[1-9][0-9]{0,3}", _stream_interval.strip()):
    raise ValueError(f"WORKBENCH_STREAM_INTERVAL must be a whole number of tokens from 1 to 9999, not {_stream_interval!r}")
WORKBENCH_STREAM_INTERVAL = int(_stream_interval)
# The least time between two deltas of one request, in ms (stream_interval.py): what a step makes
# meanwhile travels together. 0 sends every step's tokens as they come.
_stream_gap = os.environ.get("WORKBENCH_STREAM_GAP_MS", "0")
if not re.fullmatch(r"[0-9]{1,5}(\.[0-9]+)?", _stream_gap.strip()) or float(_stream_gap) > 10000:
    raise ValueError(f"WORKBENCH_STREAM_GAP_MS must be a number of milliseconds from 0 to 10000, not {_stream_gap!r}")
WORKBENCH_STREAM_GAP_S = float(_stream_gap) / 1000
# Limits on what one websocket frame or HTTP body may carry.
WORKBENCH_MAX_FRAME_BYTES = int(os.environ.get("WORKBENCH_MAX_FRAME_BYTES", 256 * 1024))
