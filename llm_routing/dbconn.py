"""Database connections on the request path: a pooled connection is never held while a
request waits on an upstream.

With Django's PostgreSQL ``pool`` option (docs/production.md, "PostgreSQL connection
pool"), a connection goes back to the pool when Django closes it — normally at the end
of the request. A request that touched the database before its upstream call (a token or
config cache miss, a session lookup) would hold its connection for the whole call; the
router hands it back first (:func:`release_pooled_connections`). Persistent connections
(``CONN_MAX_AGE`` > 0, no pool) and connections inside a transaction are left alone.

:func:`on_event_loop` asks whether code runs on a running event loop, where any
blocking call stalls every request of the worker; :func:`queries_refused_here`
whether Django would refuse a query here (``SynchronousOnlyOperation``): on a loop,
unless the process allows it (``DJANGO_ALLOW_ASYNC_UNSAFE``, as a notebook or a
Playwright test does, whose thread runs a loop).
"""

from __future__ import annotations

import asyncio
import os

from django.db import connections

__all__ = ["on_event_loop", "queries_refused_here", "release_pooled_connections"]


def on_event_loop() -> bool:
    """Whether the calling code runs on a running event loop (in its thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def queries_refused_here() -> bool:
    """Whether Django refuses a database query from the calling code (its
    ``async_unsafe`` rule: on a running event loop, unless ``DJANGO_ALLOW_ASYNC_UNSAFE``
    is set)."""
    return not os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE") and on_event_loop()


def release_pooled_connections() -> None:
    """Return this thread's idle pooled connections to their pools."""
    for conn in connections.all(initialized_only=True):
        options = conn.settings_dict.get("OPTIONS") or {}
        if options.get("pool") and conn.connection is not None and not conn.in_atomic_block:
            conn.close()
