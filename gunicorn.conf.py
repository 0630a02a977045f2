"""gunicorn configuration for the demo project (``gunicorn -c gunicorn.conf.py``).

Every value comes from the environment (documented in ``.env.example``). Threads
(``gthread``) let one worker process wait on several slow upstreams at once; the
timeout must exceed ``LLM_ROUTING["REQUEST_DEADLINE_S"]`` (60 s by default).
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
    "threads",
    "timeout",
    "worker_class",
    "workers",
    "wsgi_app",
]

wsgi_app = "project.wsgi:application"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", str(multiprocessing.cpu_count() * 2 + 1)))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "90"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# Recycle workers now and then so a slow leak can never grow without bound.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "2000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "200"))
# Only trust X-Forwarded-* from the reverse proxy in front of gunicorn.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-") or None  # empty: no access log
errorlog = "-"


def child_exit(server: object, worker: object) -> None:
    """Prometheus multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set): a dead worker's
    live gauges leave the scrape (docs/observability.md)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]
