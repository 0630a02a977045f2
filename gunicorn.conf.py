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
import socket

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
    "post_fork",
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
# Every worker busy (docs/production.md, "Connections over the workers"): each async
# worker also accepts on a listening socket of its own, bound to the same address with
# SO_REUSEPORT, so the kernel spreads new connections over the workers by their
# addresses. On the one socket they share, the worker that wins the accept takes every
# connection a client opens at once, and keep-alive keeps them there (measured: one
# worker at 100 % of a core, the other idle, at 16 connections). gunicorn's own
# reuse_port only sets the flag on that shared socket; it is needed for the workers'
# sockets to join it. GUNICORN_REUSE_PORT=false turns both off.
reuse_port = _asgi and os.environ.get("GUNICORN_REUSE_PORT", "true").lower() != "false"


def own_listeners(shared: list[object], backlog: int) -> list[socket.socket]:
    """A listening socket per inherited TCP one, bound to its address with
    SO_REUSEPORT (a UNIX socket has no such group: none for it)."""
    out = []
    for listener in shared:
        family = getattr(listener, "family", None)
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        own = socket.socket(family, socket.SOCK_STREAM)
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        own.bind(listener.getsockname())  # type: ignore[attr-defined]
        own.listen(backlog)
        own.setblocking(False)
        out.append(own)
    return out


def post_fork(server: object, worker: object) -> None:
    """In each new worker: its own SO_REUSEPORT listener first, the shared one kept (the
    kernel hashes a share of the connections to it too: every worker accepts those)."""
    if reuse_port and hasattr(socket, "SO_REUSEPORT"):
        shared = list(worker.sockets)  # type: ignore[attr-defined]
        backlog = int(server.cfg.backlog)  # type: ignore[attr-defined]
        worker.sockets = [*own_listeners(shared, backlog), *shared]  # type: ignore[attr-defined]


def child_exit(server: object, worker: object) -> None:
    """Prometheus multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set): a dead worker's
    live gauges leave the scrape (docs/observability.md)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]
