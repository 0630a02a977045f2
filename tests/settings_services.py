"""Settings of the services suite: the test settings on PostgreSQL and Redis.

Selected by ``python3 dev.py test --services`` (through tests/services_plugin.py), and
by the web and worker processes the end-to-end tests start. Every address comes from
an ``LLMR_TEST_*`` variable whose default is what CI runs on this machine.
"""

from __future__ import annotations

import os

import environ

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": environ.Env.db_url_config(
        os.environ.get("LLMR_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_routing")
    )
}
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": os.environ.get("LLMR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
        # One prefix per test session (the web/worker processes get the session's).
        "KEY_PREFIX": os.environ.get("LLMR_TEST_CACHE_PREFIX", f"llmr-test-{os.getpid()}"),
    }
}

# The test process itself stays eager; the worker/web subprocesses get a real broker.
CELERY_BROKER_URL = os.environ.get("LLMR_TEST_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("LLMR_TEST_QUEUE", "llm_routing")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": int(os.environ.get("LLMR_TEST_VISIBILITY_TIMEOUT", "3600")),
    # Redis broker: sweep for unacknowledged messages every second, so a killed
    # worker's message comes back within a test's patience (kombu's default cadence
    # is about 100 s on top of the visibility timeout).
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}

LLM_ROUTING = {
    "DEFAULT_CHAIN": [],
    # A provider kind that answers after a delay (tests/sleepy.py), for kill tests.
    "PROVIDER_KINDS": {"sleepy": "tests.sleepy.SleepyProvider"},
    "REQUEST_DEADLINE_S": float(os.environ.get("LLMR_TEST_DEADLINE_S", "60")),
    "JOB_LEASE_GRACE_S": float(os.environ.get("LLMR_TEST_LEASE_GRACE_S", "30")),
    # GET /metrics of the spawned gunicorn (tests/test_metrics_services.py).
    "METRICS_TOKEN": os.environ.get("LLM_ROUTING_METRICS_TOKEN") or None,
    # How the spawned servers record decisions (tests/test_asgi_server_services.py).
    "RECORD_MODE": os.environ.get("LLMR_TEST_RECORD_MODE", "inline"),
    "SPOOL_DIR": os.environ.get("LLMR_TEST_SPOOL_DIR") or None,
}
if os.environ.get("LLMR_TEST_NO_THROTTLES"):  # the budget race: only budgets may refuse
    LLM_ROUTING["API_THROTTLE_CLASSES"] = []
