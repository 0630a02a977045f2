"""Demo project settings. django-environ lives ONLY here (the app never reads the
environment except provider keys at call time).

Embedded defaults: SQLite, LocMem cache, no broker. Every variable is documented in
``.env.example``; ``.env`` beside manage.py is read when present.
"""

from __future__ import annotations

import os
from pathlib import Path

import environ

from project.env_bootstrap import routing_from_env

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "django-insecure-demo-only-key-do-not-use-in-production"  # noqa: S105
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "llm_routing",
    "project",
]

MIDDLEWARE = [
    # First: every later log line of the request carries its id (docs/observability.md).
    "llm_routing.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=0))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# PostgreSQL: a bounded connection pool per worker process (psycopg's pool, Django's
# "pool" option; docs/production.md "PostgreSQL connection pool"). Django requires
# CONN_MAX_AGE = 0 with it: a connection goes back to the pool when Django closes it.
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env.bool(
    "DB_POOL", default=True
):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env.int("DB_POOL_MIN", default=2),
        "max_size": env.int("DB_POOL_MAX", default=8),
        # A request waits at most this long for a free connection, then fails (500).
        "timeout": env.float("DB_POOL_TIMEOUT", default=10.0),
    }

# CACHE_URL wins; REDIS_URL alone selects Django's Redis backend (circuits shared by all
# workers). Bounded socket timeouts: a dead Redis must fail fast, never hang a request.
CACHES = {
    "default": env.cache(
        "CACHE_URL", default=env.str("REDIS_URL", default="") or "locmemcache://llm-routing"
    )
}
if CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache":
    CACHES["default"].setdefault("OPTIONS", {}).update(
        {"socket_connect_timeout": 1.0, "socket_timeout": 1.0}
    )

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=str(BASE_DIR / "staticfiles"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Bodies above this are refused by Django itself; the app's own cap
# (LLM_ROUTING["MAX_REQUEST_BYTES"]) answers 413 first.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "django-llm-routing",
    "DESCRIPTION": "Resilient LLM provider routing: POST /audit/ and friends.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LLM_ROUTING = {
    # DEFAULT_CHAIN and ROUTES from LLM_PROVIDER_CHAIN / LLM_PROVIDER / LLM_ROUTING_RULES.
    **routing_from_env(os.environ),
    "RETENTION_DAYS": env.float("LLM_ROUTING_RETENTION_DAYS", default=30),
    "RETENTION_BATCH_SIZE": env.int("LLM_ROUTING_RETENTION_BATCH_SIZE", default=1000),
    # Decisions the database refuses are kept here until llm_routing_spool_flush.
    "SPOOL_DIR": env.str("LLM_ROUTING_SPOOL_DIR", default="") or None,
    # "inline" (written before the answer) or "write_behind" (docs/production.md).
    "RECORD_MODE": env.str("LLM_ROUTING_RECORD_MODE", default="inline"),
    "RECORD_QUEUE_SIZE": env.int("LLM_ROUTING_RECORD_QUEUE_SIZE", default=10_000),
    # The async upstream client: "aiohttp" (httpx over aiohttp) or "httpx" (httpcore).
    "ASYNC_HTTP_TRANSPORT": env.str("LLM_ROUTING_ASYNC_HTTP_TRANSPORT", default="aiohttp"),
    # GET /metrics answers only this bearer token; unset: /metrics is 404.
    "METRICS_TOKEN": env.str("LLM_ROUTING_METRICS_TOKEN", default="") or None,
    "API_THROTTLE_RATES": {
        "user": env.str("LLM_ROUTING_USER_RATE", default="120/min"),
        "anon": env.str("LLM_ROUTING_ANON_RATE", default="10/min"),
    },
}

# --- Celery: async audit jobs and retention (issue 6) --------------------------------
# No broker configured → tasks run eagerly in the web process (the embedded mode).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
# The DEBUG 500 page masks URL passwords (broker, cache, database URLs) and DSNs.
DEFAULT_EXCEPTION_REPORTER_FILTER = "project.reporting.CredentialSafeReporterFilter"
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="llm_routing")
CELERY_TASK_ACKS_LATE = True  # acknowledge after the task ran …
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # … and redeliver when its worker died
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True  # job state lives in the AuditJob row, not a backend
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Redis broker only: an unacknowledged message is redelivered after this many seconds.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULE = {
    "llm-routing-purge": {
        "task": "llm_routing.purge_routing_logs",
        "schedule": env.float("LLM_ROUTING_PURGE_EVERY_S", default=3600.0),
    },
    "llm-routing-requeue-stale-jobs": {
        "task": "llm_routing.requeue_stale_jobs",
        "schedule": env.float("LLM_ROUTING_REQUEUE_EVERY_S", default=300.0),
    },
    "llm-routing-flush-decision-spool": {
        "task": "llm_routing.flush_decision_spool",
        "schedule": env.float("LLM_ROUTING_SPOOL_FLUSH_EVERY_S", default=60.0),
    },
}

# --- production hardening, all through the environment ----------------------------
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
if env.bool("USE_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Every line carries the id of the request it was written for (request_id; "-" outside
# one). LOG_FORMAT=json writes one JSON object per line for log shippers. Every 5xx is
# logged by django.request with its traceback, DEBUG on or off (docs/observability.md).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "llm_routing.logging.RequestIdFilter"},
        "redact_keys": {"()": "llm_routing.logging.RedactKeysFilter"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "llm_routing.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if env.str("LOG_FORMAT", default="plain") == "json" else "plain",
            "filters": ["request_id", "redact_keys"],
        }
    },
    "loggers": {
        "llm_routing": {
            "handlers": ["console"],
            "level": env.str("LLM_ROUTING_LOG_LEVEL", default="INFO"),
        },
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
