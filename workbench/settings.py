"""Django settings, from the environment; the defaults are the embedded single-process workbench.

WORKBENCH_SECRET_KEY, WORKBENCH_DEBUG (off unless set), WORKBENCH_ALLOWED_HOSTS (comma-separated),
DATABASE_URL (any database dj-database-url reads, e.g. postgres://...; unset: SQLite at WORKBENCH_DB_PATH),
WORKBENCH_MODEL ("demo" or a model directory), WORKBENCH_DEVICE, WORKBENCH_DTYPE, WORKBENCH_PREFIX_CACHE_SCOPE,
WORKBENCH_MAX_NUM_BATCHED_TOKENS, WORKBENCH_MAX_PREFILL_BESIDE_DECODES, WORKBENCH_KV_CACHE_MB, WORKBENCH_MAX_FRAME_BYTES,
WORKBENCH_STATIC_ROOT; the transport: WORKBENCH_TRANSPORT ("inprocess" or "celery"), REDIS_URL,
WORKBENCH_QUEUE_PREFIX, WORKBENCH_WORKER_CAPACITY, WORKBENCH_HEARTBEAT_S, WORKBENCH_WORKER_LOST_S,
WORKBENCH_DRAIN_S; the limits: WORKBENCH_SOCKET_MESSAGE_BYTES, WORKBENCH_USER_CONCURRENT_REQUESTS,
WORKBENCH_USER_REQUESTS_PER_MINUTE, WORKBENCH_MAX_IN_FLIGHT, WORKBENCH_QUEUE_TIMEOUT_S, WORKBENCH_REQUEST_TIMEOUT_S,
WORKBENCH_LIMIT_LEASE_S, WORKBENCH_LIMITS_PREFIX, WORKBENCH_USER_SOCKETS, WORKBENCH_SOCKET_FRAMES_PER_S,
WORKBENCH_SOCKET_RECHECK_S, WORKBENCH_USER_TOKENIZE_PER_MINUTE, WORKBENCH_USER_INPUT_SHARE, WORKBENCH_USER_INPUT_QUEUE; accounts:
WORKBENCH_SIGNUP, WORKBENCH_LOGIN_FAILURES_PER_ACCOUNT,
WORKBENCH_LOGIN_FAILURES_PER_ADDRESS, WORKBENCH_SIGNUPS_PER_ADDRESS, WORKBENCH_THROTTLE_WINDOW_S; TLS:
WORKBENCH_SECURE_COOKIES, WORKBENCH_PROXY_SSL_HEADER, WORKBENCH_HSTS_SECONDS, WORKBENCH_CSRF_TRUSTED_ORIGINS, WORKBENCH_CSP.
docs/OPERATIONS.md says what each is for. Every variable is read through workbench/env.py, which
refuses a malformed one at start with ImproperlyConfigured naming it. The engine's own ARC_* flags are
read by the engine (EngineConfig.from_env).
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from workbench.content_security import DEFAULT_POLICY
from workbench.env import env_bool, env_float, env_int, env_list, env_str
from workbench.secret_key import DEVELOPMENT_KEY

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("WORKBENCH_DEBUG", False)
# The development key is refused where it would matter: the web application with DEBUG off
# (workbench/secret_key.py); `make run` and `make stack` pass a key of the checkout's own.
SECRET_KEY = env_str("WORKBENCH_SECRET_KEY", DEVELOPMENT_KEY)
ALLOWED_HOSTS = env_list("WORKBENCH_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

# Behind a TLS proxy (docs/OPERATIONS.md, "Behind a TLS proxy"). SECURE_COOKIES: the session and CSRF
# cookies are sent over HTTPS only. PROXY_SSL_HEADER: the header the proxy sets to "https" on the requests
# it took over TLS (X-Forwarded-Proto), which Django then counts as secure; set it only behind a proxy
# that overwrites it, since a client can send it too. HSTS_SECONDS: how long browsers must use HTTPS
# only (sent on secure requests; 0: not sent). CSRF_TRUSTED_ORIGINS: the https:// origins forms may be
# posted from, when the proxy's differs from what Django sees.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("WORKBENCH_SECURE_COOKIES", False)
_PROXY_SSL_HEADER = env_str("WORKBENCH_PROXY_SSL_HEADER", pattern=r"[A-Za-z0-9-]{1,64}",
                            expected="a header name, like X-Forwarded-Proto")
SECURE_PROXY_SSL_HEADER = (("HTTP_" + _PROXY_SSL_HEADER.upper().replace("-", "_"), "https") if _PROXY_SSL_HEADER
                           else None)
SECURE_HSTS_SECONDS = env_int("WORKBENCH_HSTS_SECONDS", 0, minimum=0, unit="seconds")
CSRF_TRUSTED_ORIGINS = env_list("WORKBENCH_CSRF_TRUSTED_ORIGINS", [])
# The content-security policy sent with every response (workbench/content_security.py); "off" sends none.
_CSP = env_str("WORKBENCH_CSP", DEFAULT_POLICY, pattern=r"[ -~]+", expected="a policy on one line, or off")
WORKBENCH_CSP = "" if _CSP == "off" else _CSP

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "workbench.accounts",
    "workbench.api",
    "workbench.chat",
    "workbench.ops",
]
# Who may make an account (workbench/accounts/signup.py): "open" (anyone who reaches the page), "invite"
# (with a code an operator made in the admin) or "closed" (operators make them). "invite" by default: a
# server on a shared network is reached by strangers, and an account is what every limit is counted by.
WORKBENCH_SIGNUP = env_str("WORKBENCH_SIGNUP", "invite", choices=("open", "invite", "closed"))
AUTH_PASSWORD_VALIDATORS = [{"NAME": f"django.contrib.auth.password_validation.{name}"} for name in (
    "UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator",
    "NumericPasswordValidator")]
# Throttles (workbench/accounts/throttle.py; 0 turns one off): failed sign-ins per account and per client
# address, and sign-up attempts per client address, each in a window of THROTTLE_WINDOW_S.
WORKBENCH_LOGIN_FAILURES_PER_ACCOUNT = env_int("WORKBENCH_LOGIN_FAILURES_PER_ACCOUNT", 10, minimum=0, unit="failures")
WORKBENCH_LOGIN_FAILURES_PER_ADDRESS = env_int("WORKBENCH_LOGIN_FAILURES_PER_ADDRESS", 50, minimum=0, unit="failures")
WORKBENCH_SIGNUPS_PER_ADDRESS = env_int("WORKBENCH_SIGNUPS_PER_ADDRESS", 10, minimum=0, unit="attempts")
WORKBENCH_THROTTLE_WINDOW_S = env_float("WORKBENCH_THROTTLE_WINDOW_S", 900.0, positive=True, unit="seconds")
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "conversations"
LOGOUT_REDIRECT_URL = "login"

# With DEBUG on, requests from beyond this machine are refused first (workbench/debug_guard.py).
MIDDLEWARE = (["workbench.debug_guard.LoopbackClientsOnly"] if DEBUG else []) + [
    "django.middleware.security.SecurityMiddleware",
    # Daphne serves no static files; WhiteNoise lets the app serve its own assets (no CDN, works offline).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "workbench.content_security.ContentSecurityPolicy",
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

_SQLITE_URL = "sqlite:///" + env_str("WORKBENCH_DB_PATH", str(BASE_DIR / "workbench.sqlite3"))
DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL", _SQLITE_URL))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# "inprocess": the engine on a thread of this process (the embedded default). "celery": requests go to
# Celery GPU workers over Redis, and tokens come back through the channels-redis layer.
WORKBENCH_TRANSPORT = env_str("WORKBENCH_TRANSPORT", "inprocess", choices=("inprocess", "celery"))
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# The consumers' own layer stays in memory even with the Celery transport: the transport keeps a
# channels-redis layer of its own (workbench/serving/celery/wire.py), so a Redis outage ends requests with a
# clear error instead of crashing every open websocket in Channels' dispatch loop.
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Every worker's Celery queue is <prefix>.<worker id>; several deployments can share one Redis.
WORKBENCH_QUEUE_PREFIX = env_str("WORKBENCH_QUEUE_PREFIX", "workbench", pattern=r"[A-Za-z0-9_-]{1,32}",
                                 expected="1-32 letters, digits, '-' or '_'")
# The throttles' counts (workbench/accounts/throttle.py): in Redis with the Celery transport, where several
# web processes must count together; in this process's memory otherwise (it is the only web process).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                      "KEY_PREFIX": WORKBENCH_QUEUE_PREFIX} if WORKBENCH_TRANSPORT == "celery" else
          # Room for every throttle count of a busy day: at its default of 300 entries LocMemCache culls the
          # least recently used, and a guesser trying new names could evict an account's failure count.
          {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "OPTIONS": {"MAX_ENTRIES": 1_000_000}}}
# Requests (running + waiting) one worker accepts before the web side answers "overloaded".
WORKBENCH_WORKER_CAPACITY = env_int("WORKBENCH_WORKER_CAPACITY", 256, minimum=1, unit="requests")
# A worker publishes its heartbeat every HEARTBEAT_S; one silent for WORKER_LOST_S is lost, and its
# requests end with an error.
WORKBENCH_HEARTBEAT_S = env_float("WORKBENCH_HEARTBEAT_S", 1.0, positive=True, unit="seconds")
WORKBENCH_WORKER_LOST_S = env_float("WORKBENCH_WORKER_LOST_S", 4.0, positive=True, unit="seconds")
# Limits on requests (workbench/serving/limits.py; 0 turns one off): what one user may have under way
# and start in a minute (beyond: rate_limited; counted in Redis across web processes with the Celery
# transport, in this process otherwise), what this process holds in all (beyond: overloaded), how long
# a request may wait for its first output and run in all (timeout).
WORKBENCH_USER_CONCURRENT_REQUESTS = env_int("WORKBENCH_USER_CONCURRENT_REQUESTS", 64, minimum=0, unit="requests")
WORKBENCH_USER_REQUESTS_PER_MINUTE = env_int("WORKBENCH_USER_REQUESTS_PER_MINUTE", 600, minimum=0, unit="requests")
# Sockets one user may hold open (across web processes with the Celery transport), frames a second one
# socket may send (in bursts of two seconds' worth), /tokenize and /detokenize calls one user may make a
# minute (0: no limit each).
WORKBENCH_USER_SOCKETS = env_int("WORKBENCH_USER_SOCKETS", 32, minimum=0, unit="sockets")
WORKBENCH_SOCKET_FRAMES_PER_S = env_int("WORKBENCH_SOCKET_FRAMES_PER_S", 50, minimum=0, unit="frames")
# How long an open socket keeps the answer that its user may still use it (workbench/protocol/socket_access.py)
# before asking the database again at its next frame; a change saved by this process ends it at once.
# 0 asks at every frame.
WORKBENCH_SOCKET_RECHECK_S = env_float("WORKBENCH_SOCKET_RECHECK_S", 1.0, minimum=0, maximum=60, unit="seconds")
WORKBENCH_USER_TOKENIZE_PER_MINUTE = env_int("WORKBENCH_USER_TOKENIZE_PER_MINUTE", 600, minimum=0, unit="calls")
# One user's share of the thread that reads large requests (workbench/serving/input_share.py): the fraction
# of its time over 10 s, and how many of their large requests may wait for it (0: no limit each).
WORKBENCH_USER_INPUT_SHARE = env_float("WORKBENCH_USER_INPUT_SHARE", 0.25, minimum=0, maximum=1, unit="of the thread")
WORKBENCH_USER_INPUT_QUEUE = env_int("WORKBENCH_USER_INPUT_QUEUE", 2, minimum=0, unit="requests")
WORKBENCH_MAX_IN_FLIGHT = env_int("WORKBENCH_MAX_IN_FLIGHT", 1024, minimum=0, unit="requests")
WORKBENCH_QUEUE_TIMEOUT_S = env_float("WORKBENCH_QUEUE_TIMEOUT_S", 120.0, minimum=0, unit="seconds")
WORKBENCH_REQUEST_TIMEOUT_S = env_float("WORKBENCH_REQUEST_TIMEOUT_S", 600.0, minimum=0, unit="seconds")
# With the Celery transport a request's slot is a lease in Redis that its web process renews every third
# of this; a process that dies frees its users' slots within it. Keys under LIMITS_PREFIX (unset: the
# queue prefix), so deployments (or test runs) sharing a Redis count apart.
WORKBENCH_LIMIT_LEASE_S = env_float("WORKBENCH_LIMIT_LEASE_S", 30.0, positive=True, unit="seconds")
WORKBENCH_LIMITS_PREFIX = env_str("WORKBENCH_LIMITS_PREFIX", "", pattern=r"[A-Za-z0-9_-]{1,32}",
                                  expected="1-32 letters, digits, '-' or '_'")
# How long an API request's reproducibility record is kept for POST /v1/reproduce/{id} (chat replies keep
# theirs with the stored message).
WORKBENCH_REPRODUCE_RETENTION_S = env_float("WORKBENCH_REPRODUCE_RETENTION_S", 86400.0, positive=True, unit="seconds")
# On a warm shutdown (SIGTERM) a worker takes nothing new and gives what it holds this long to finish.
WORKBENCH_DRAIN_S = env_float("WORKBENCH_DRAIN_S", 30.0, minimum=0, unit="seconds")

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Deployments set WORKBENCH_STATIC_ROOT and run `manage.py collectstatic`; unset, nothing is collected.
STATIC_ROOT = env_str("WORKBENCH_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True  # the embedded default serves straight from static/ without collectstatic
USE_TZ = True
TIME_ZONE = "UTC"

WORKBENCH_MODEL = env_str("WORKBENCH_MODEL", "demo")
WORKBENCH_DEVICE = env_str("WORKBENCH_DEVICE", "cpu")
WORKBENCH_DTYPE = env_str("WORKBENCH_DTYPE", "float32", choices=("float32", "bfloat16", "float16"))
# GGUF models: "quantized" or "dequantized" weights; unset, the engine's default for the device.
WORKBENCH_WEIGHTS = env_str("WORKBENCH_WEIGHTS", choices=("quantized", "dequantized")) or None
# Whose cached prompt prefixes a request may reuse (engine/scheduler/block_pool.py): "user" (its own user's
# only, the default) or "deployment" (everyone's: shares a system prompt's KV, but lets one user time
# whether another's prompt began with a guessed text; docs/OPERATIONS.md, "Prefix caching").
WORKBENCH_PREFIX_CACHE_SCOPE = env_str("WORKBENCH_PREFIX_CACHE_SCOPE", "user", choices=("user", "deployment"))
# Days a stored /v1/responses reply is kept (OpenAI keeps them 30): an older one reads as not found
# and is deleted at the next store (workbench/api/responses/store.py). 0 keeps them until deleted.
WORKBENCH_RESPONSES_RETENTION_DAYS = env_int("WORKBENCH_RESPONSES_RETENTION_DAYS", 30, minimum=0, unit="days")
# The engine's KV pool in MB (EngineConfig.kv_cache_mb). Unset: the engine's default (2048 on a CPU, taken
# as blocks are first written; on a GPU 80% of the memory free once the weights are loaded).
WORKBENCH_KV_CACHE_MB = env_int("WORKBENCH_KV_CACHE_MB", 0, minimum=1, unit="MB") or None
# The tokens one engine step may feed (EngineConfig.max_num_batched_tokens): a longer prompt is
# prefilled in chunks. Unset: the engine's default (2048).
WORKBENCH_MAX_NUM_BATCHED_TOKENS = env_int("WORKBENCH_MAX_NUM_BATCHED_TOKENS", 0, minimum=1, unit="tokens") or None
# While any stream decodes, the prompt tokens a step may feed beside them (EngineConfig.
# max_prefill_beside_decodes): the bound on the streams' inter-token latency while a long prompt
# arrives. Unset: the engine's default for the device (256 on a CPU, none on a GPU).
WORKBENCH_MAX_PREFILL_BESIDE_DECODES = env_int("WORKBENCH_MAX_PREFILL_BESIDE_DECODES", 0, minimum=1,
                                               unit="tokens") or None
# Tokens a request's deltas gather before they go out (workbench/serving/stream_interval.py): 1 sends
# every step's tokens; N sends N times fewer messages, for servers where per-message cost dominates.
# The first tokens and the last event always go at once. Read by the process that runs the engine.
WORKBENCH_STREAM_INTERVAL = env_int("WORKBENCH_STREAM_INTERVAL", 1, minimum=1, maximum=9999, unit="tokens")
# The least time between two deltas of one request, in ms (stream_interval.py): what a step makes
# meanwhile travels together. 0 sends every step's tokens as they come.
WORKBENCH_STREAM_GAP_S = env_float("WORKBENCH_STREAM_GAP_MS", 0.0, minimum=0, maximum=10000,
                                   unit="milliseconds") / 1000
# The bearer token a /metrics scrape must send (workbench/ops/metrics.py); unset, /metrics is open.
WORKBENCH_METRICS_TOKEN = env_str("WORKBENCH_METRICS_TOKEN")
# Limits on what one websocket frame or HTTP body may carry.
WORKBENCH_MAX_FRAME_BYTES = env_int("WORKBENCH_MAX_FRAME_BYTES", 256 * 1024, minimum=1, unit="bytes")
# The largest websocket message Daphne takes in at all (workbench/serve.py): up to it, a message over
# WORKBENCH_MAX_FRAME_BYTES is refused whole with a frame_too_large error and the socket lives on; over
# it, the socket is closed with 1009. It bounds what one socket can make the server buffer.
WORKBENCH_SOCKET_MESSAGE_BYTES = env_int("WORKBENCH_SOCKET_MESSAGE_BYTES", 16 * 1024 * 1024, minimum=1,
                                         unit="bytes")
