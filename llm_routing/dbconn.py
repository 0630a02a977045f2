"""Database connections on the request path: a pooled connection is never held while a
request waits on an upstream.

With Django's PostgreSQL ``pool`` option (docs/production.md, "PostgreSQL connection
pool"), a connection goes back to the pool when Django closes it — normally at the end
of the request. A request that touched the database before its upstream call (a token or
config cache miss, a session lookup) would hold its connection for the whole call; the
router hands it back first (:func:`release_pooled_connections`). Persistent connections
(``CONN_MAX_AGE`` > 0, no pool) and connections inside a transaction are left alone.

:func:`on_event_loop` is the one question "may this sync code block here?": on a
running event loop Django refuses a query (``SynchronousOnlyOperation``) and any other
blocking call stalls every request of the worker.
"""

from __future__ import annotations

import asyncio

from django.db import connections

__all__ = ["on_event_loop", "release_pooled_connections"]


def on_event_loop() -> bool:
    """Whether the calling code runs on a running event loop (in its thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def release_pooled_connections() -> None:
    """Return this thread's idle pooled connections to their pools."""
    for conn in connections.all(initialized_only=True):
        options = conn.settings_dict.get("OPTIONS") or {}
        if options.get("pool") and conn.connection is not None and not conn.in_atomic_block:
            conn.close()
