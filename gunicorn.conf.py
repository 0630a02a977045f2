"""gunicorn configuration for the demo project (``gunicorn -c gunicorn.conf.py``).

Every value comes from the environment (documented in ``.env.example``).

**ASGI by default**: uvicorn workers (``uvicorn_worker.UvicornWorker``) serving
``project.asgi:application``; each worker holds many slow upstream calls on one event
loop. ``GUNICORN_WORKER_CLASS=gthread`` serves ``project.wsgi:application`` with
threads instead (``GUNICORN_THREADS`` per worker), for hosts that stay sync
(docs/production.md). The timeout must exceed ``LLM_ROUTING["REQUEST_DEADLINE_S"]``
(60 s by default).
"""

from __future__ import annotations

import multiprocessing
import os

__all__ = [
    "accesslog",
    "bind",
    "child_exit",
    "errorlog",
    "forwarded_allow_ips",
    "graceful_timeout",
    "keepalive",
    "max_requests",
    "max_requests_jitter",
    "post_worker_init",
    "reuse_port",
    "threads",
    "timeout",
    "worker_class",
    "workers",
    "wsgi_app",
]

ASGI_WORKER = "uvicorn_worker.UvicornWorker"

worker_class = os.environ.get("GUNICORN_WORKER_CLASS", ASGI_WORKER)
_asgi = "uvicorn" in worker_class.lower()  # UvicornWorker, UvicornH11Worker, a subclass
# gunicorn's name for "the application", whichever protocol the worker speaks.
# GUNICORN_APP picks another (bench/gateways.py: project.asgi:django_application, the
# ASGI application without the lean lane).
wsgi_app = os.environ.get(
    "GUNICORN_APP", "project.asgi:application" if _asgi else "project.wsgi:application"
)
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# An event loop keeps one core busy on its own; threads wait on I/O, so more of them.
_default_workers = multiprocessing.cpu_count() if _asgi else multiprocessing.cpu_count() * 2 + 1
workers = int(os.environ.get("WEB_CONCURRENCY", str(_default_workers)))
threads = int(os.environ.get("GUNICORN_THREADS", "8"))  # gthread only
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "90"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# Recycle workers now and then so a slow leak can never grow without bound — rarely: a
# recycled worker drops its clients' keep-alive connections and boots Django again, and
# at 2,000 an async worker serving 250 req/s recycled every 8 s (wrk counted the
# dropped connections as errors; docs/benchmarks.md). Memory per worker is flat under
# load (docs/benchmarks.md, "Memory per worker").
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "50000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "5000"))
# Only trust X-Forwarded-* from the reverse proxy in front of gunicorn.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-") or None  # empty: no access log
errorlog = "-"
# Every worker busy (docs/production.md, "Connections over the workers"): with
# reuse_port, gunicorn (27, the pinned version) opens no listening socket in the master;
# each worker binds its own with SO_REUSEPORT, and the kernel spreads new connections over
# them by their addresses. On one shared socket the worker that wins an accept takes
# every connection a client opens at once, and keep-alive keeps them there (measured:
# one worker at 100 % of a core, the other idle, at 16 connections).
# GUNICORN_REUSE_PORT=false: one shared socket.
reuse_port = _asgi and os.environ.get("GUNICORN_REUSE_PORT", "true").lower() != "false"


def child_exit(server: object, worker: object) -> None:
    """Prometheus multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set): a dead worker's
    live gauges leave the scrape (docs/observability.md)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]


# The app's system check llm_routing.E020 (a process-local routing cache under several
# workers) reads the worker count from WEB_CONCURRENCY: say it to the workers too.
os.environ["WEB_CONCURRENCY"] = str(workers)


def post_worker_init(worker: object) -> None:
    """Log the app's shared-cache check (``llm_routing.E020``) at each worker's start:
    gunicorn runs no system check itself (docs/production.md)."""
    from llm_routing.checks import check_shared_cache

    for message in check_shared_cache():
        worker.log.error("%s: %s %s", message.id, message.msg, message.hint)  # type: ignore[attr-defined]
