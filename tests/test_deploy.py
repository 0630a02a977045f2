"""The demo project under production-like environment variables: ``check --deploy``
is clean, and the Celery/cache settings follow the environment."""

from __future__ import annotations

import json

from .support import ROOT, clean_env, manage, python

PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "prod-like-" + "k3y-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ" * 2,
    "ALLOWED_HOSTS": "llm.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://llm.example.com",
    "DATABASE_URL": "postgres://llm:pw@db.internal:5432/llm_routing",
    "CONN_MAX_AGE": "60",
    "REDIS_URL": "redis://cache.internal:6379/0",
    "CELERY_BROKER_URL": "redis://cache.internal:6379/1",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "USE_X_FORWARDED_PROTO": "true",
}


def test_check_deploy_is_clean_under_production_env() -> None:
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=clean_env(**PRODUCTION_ENV))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_flags_the_embedded_defaults() -> None:
    # The same command without the hardening variables fails: the test can fail.
    env = clean_env(DEBUG="false", SECRET_KEY=PRODUCTION_ENV["SECRET_KEY"])
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode != 0
    assert "security.W004" in result.stderr  # SECURE_HSTS_SECONDS


SHOW = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "from project import celery_app as app; "
    "print(json.dumps({'db': s.DATABASES['default']['ENGINE'], "
    "'max_age': s.DATABASES['default']['CONN_MAX_AGE'], "
    "'health': s.DATABASES['default']['CONN_HEALTH_CHECKS'], "
    "'cache': s.CACHES['default']['BACKEND'], 'eager': app.conf.task_always_eager, "
    "'broker': app.conf.broker_url, 'acks_late': app.conf.task_acks_late, "
    "'reject': app.conf.task_reject_on_worker_lost, "
    "'beat': sorted(e['task'] for e in app.conf.beat_schedule.values())}))"
)


def test_production_env_selects_postgres_redis_and_a_real_broker() -> None:
    env = clean_env(**PRODUCTION_ENV, DJANGO_SETTINGS_MODULE="project.settings")
    result = python("-c", SHOW, env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["db"] == "django.db.backends.postgresql"
    # PostgreSQL: the connection pool is on, which requires CONN_MAX_AGE = 0.
    assert shown["max_age"] == 0 and shown["health"] is True
    assert shown["cache"] == "django.core.cache.backends.redis.RedisCache"
    assert shown["eager"] is False
    assert shown["broker"] == "redis://cache.internal:6379/1"
    assert shown["acks_late"] is True and shown["reject"] is True
    assert shown["beat"] == [
        "llm_routing.flush_decision_spool",
        "llm_routing.purge_routing_logs",
        "llm_routing.requeue_stale_jobs",
    ]


def test_embedded_defaults_are_sqlite_locmem_and_eager_celery() -> None:
    env = clean_env(DEBUG="true", DJANGO_SETTINGS_MODULE="project.settings")
    shown = json.loads(python("-c", SHOW, env=env).stdout)
    assert shown["db"] == "django.db.backends.sqlite3"
    assert shown["cache"] == "django.core.cache.backends.locmem.LocMemCache"
    assert shown["eager"] is True


def test_env_example_documents_every_variable_the_settings_read() -> None:
    import re

    read = set(
        re.findall(r'env\.\w+\(\s*"([A-Z0-9_]+)"', (ROOT / "project/settings.py").read_text())
    )
    read |= set(
        re.findall(r'os\.environ\.get\("([A-Z0-9_]+)"', (ROOT / "gunicorn.conf.py").read_text())
    )
    # The routing seeds parsed by project/env_bootstrap.py (LLM_PROVIDER_CHAIN …).
    read |= set(
        re.findall(r'_VAR = "([A-Z0-9_]+)"', (ROOT / "project/env_bootstrap.py").read_text())
    )
    documented = set(re.findall(r"^#? ?([A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert {"DATABASE_URL", "CELERY_BROKER_URL", "GUNICORN_BIND", "LLM_ROUTING_RULES"} <= read
    assert read - documented == set()
