"""The demo project under production-like environment variables: ``check --deploy``
is clean, the Celery/cache settings follow the environment, and the shipped
gunicorn.conf.py serves ASGI (uvicorn workers) by default and WSGI (gthread) on request."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .support import ROOT, clean_env, manage, python
from .support import free_port as _free_port

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


# --- gunicorn.conf.py: ASGI (uvicorn workers) by default, WSGI (gthread) on request ------

SHOW_GUNICORN = (
    "import json, runpy; c = runpy.run_path('gunicorn.conf.py'); "
    "print(json.dumps({k: c[k] for k in ('worker_class', 'wsgi_app', 'workers', 'threads', "
    "'timeout', 'graceful_timeout', 'keepalive', 'max_requests')}))"
)

ASGI = {"worker_class": "uvicorn_worker.UvicornWorker", "wsgi_app": "project.asgi:application"}
WSGI = {"worker_class": "gthread", "wsgi_app": "project.wsgi:application"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, ASGI), ({"GUNICORN_WORKER_CLASS": "gthread"}, WSGI)],
    ids=["default-asgi", "gthread-wsgi"],
)
def test_gunicorn_conf_serves_asgi_by_default_and_wsgi_on_request(
    env: dict[str, str], expected: dict[str, str]
) -> None:
    result = python("-c", SHOW_GUNICORN, env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert {k: shown[k] for k in expected} == expected
    cores = multiprocessing.cpu_count()
    assert shown["workers"] == (cores if expected is ASGI else 2 * cores + 1)
    # The timeouts stay above REQUEST_DEADLINE_S (60 s) whatever the worker.
    assert (shown["timeout"], shown["graceful_timeout"], shown["keepalive"]) == (90, 30, 5)
    assert shown["max_requests"] == 50000  # rarely: a recycle drops keep-alive clients


@pytest.mark.parametrize(
    ("env", "server"),
    [({}, "uvicorn"), ({"GUNICORN_WORKER_CLASS": "gthread"}, "gunicorn")],
    ids=["default-asgi", "gthread-wsgi"],
)
def test_the_shipped_config_starts_and_answers(
    env: dict[str, str], server: str, tmp_path: Path
) -> None:
    """gunicorn as production starts it; /health/ answers 401 to an anonymous caller
    (no database needed) from the expected server; SIGTERM stops it gracefully, through
    the ASGI lifespan shutdown (where the async HTTP clients are closed)."""
    port = _free_port()
    log_path = tmp_path / "gunicorn.log"
    run_env = clean_env(
        DEBUG="true",
        DJANGO_SETTINGS_MODULE="project.settings",
        GUNICORN_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="1",
        GUNICORN_ACCESSLOG="",
        PYTHONUNBUFFERED="1",
        **env,
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=run_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/health/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gunicorn did not answer within 60 s"
                time.sleep(0.2)
        assert response.status_code == 401
        assert response.headers["server"].startswith(server)
        assert "WWW-Authenticate" in response.headers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    log = log_path.read_text()
    if server == "uvicorn":
        assert "Application startup complete" in log
        assert "Application shutdown complete" in log  # the lifespan shutdown ran
    assert "Traceback" not in log


def _listeners(port: int) -> int:
    """Listening TCP sockets on 127.0.0.1:``port`` (each socket once, however many
    processes hold it)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            count += 1
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc only")
@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, 2), ({"GUNICORN_REUSE_PORT": "false"}, 1)],
    ids=["own-sockets", "one-shared-socket"],
)
def test_each_asgi_worker_accepts_on_its_own_reuseport_socket(
    env: dict[str, str], expected: int, tmp_path: Path
) -> None:
    """Issue 23, "every worker busy": with two uvicorn workers the shipped config
    leaves two listeners on the port — one SO_REUSEPORT socket per worker, over which
    the kernel spreads new connections — and one, shared, with
    GUNICORN_REUSE_PORT=false. Both answer."""
    port = _free_port()
    log_path = tmp_path / "gunicorn.log"
    run_env = clean_env(
        DEBUG="true",
        DJANGO_SETTINGS_MODULE="project.settings",
        GUNICORN_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        GUNICORN_ACCESSLOG="",
        **env,
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=run_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while log_path.read_text().count("Application startup complete") < 2:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "two workers did not start within 90 s"
            time.sleep(0.2)
        assert _listeners(port) == expected, log_path.read_text()
        for _ in range(4):  # new connections, whichever socket the kernel picks
            response = httpx.get(f"http://127.0.0.1:{port}/health/", timeout=10)
            assert response.status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert "Traceback" not in log_path.read_text()
