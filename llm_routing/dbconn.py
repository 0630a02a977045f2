"""Database connections on the request path: a pooled connection is never held while a
request waits on an upstream.

With Django's PostgreSQL ``pool`` option (docs/production.md, "PostgreSQL connection
pool"), a connection goes back to the pool when Django closes it — normally at the end
of the request. A request that touched the database before its upstream call (a token or
config cache miss, a session lookup) would hold its connection for the whole call; the
router hands it back first (:func:`release_pooled_connections`). Persistent connections
(``CONN_MAX_AGE`` > 0, no pool) and connections inside a transaction are left alone.
"""

from __future__ import annotations

from django.db import connections

__all__ = ["release_pooled_connections"]


def release_pooled_connections() -> None:
    """Return this thread's idle pooled connections to their pools."""
    for conn in connections.all(initialized_only=True):
        options = conn.settings_dict.get("OPTIONS") or {}
        if options.get("pool") and conn.connection is not None and not conn.in_atomic_block:
            conn.close()
