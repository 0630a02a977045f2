"""DRF throttles whose rates come from ``LLM_ROUTING["API_THROTTLE_RATES"]``.

Policy when the cache behind them fails (Redis down, a timeout, a refused connection):
**fail open** — the request is let through unthrottled rather than answered with a 500,
and one warning per :data:`FAIL_OPEN_LOG_INTERVAL_S` per process says so (the
exception's type only: its text may name the cache location). After a failure the
throttles leave the cache alone for :data:`CACHE_RETRY_S` (so an unreachable Redis costs
one failed call per interval, not one per request); throttling resumes by itself as
soon as the cache answers again. Documented in docs/operations.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

from ..conf import routing_settings

__all__ = [
    "CACHE_RETRY_S",
    "FAIL_OPEN_LOG_INTERVAL_S",
    "AuditAnonThrottle",
    "AuditUserThrottle",
]

logger = logging.getLogger("llm_routing.api")

#: While the throttle cache keeps failing, at most one warning per this many seconds.
FAIL_OPEN_LOG_INTERVAL_S = 60.0

#: After a cache failure, throttles do not touch the cache for this long (fail open).
CACHE_RETRY_S = 5.0

_log_lock = threading.Lock()
_next_log_at = 0.0
_retry_at = 0.0


def _cache_failed(scope: str, exc: Exception) -> None:
    global _next_log_at, _retry_at
    now = time.monotonic()
    with _log_lock:
        _retry_at = now + CACHE_RETRY_S
        if now < _next_log_at:
            return
        _next_log_at = now + FAIL_OPEN_LOG_INTERVAL_S
    logger.warning(
        "Throttle cache failed (%s); %s requests are not throttled until it answers again "
        "(fail open; next warning in %.0f s at the earliest).",
        type(exc).__name__,
        scope,
        FAIL_OPEN_LOG_INTERVAL_S,
    )


class _FailOpen(SimpleRateThrottle):
    def allow_request(self, request: Any, view: Any) -> bool:
        if time.monotonic() < _retry_at:
            return True  # the cache failed moments ago: fail open without waiting on it
        try:
            return bool(super().allow_request(request, view))
        except Exception as exc:  # the cache, whatever its backend raises
            _cache_failed(str(self.scope), exc)
            return True


class AuditUserThrottle(_FailOpen, UserRateThrottle):
    scope = "llm_routing_user"

    def get_rate(self) -> str | None:
        rate = (routing_settings.API_THROTTLE_RATES or {}).get("user")
        return str(rate) if rate else None


class AuditAnonThrottle(_FailOpen, AnonRateThrottle):
    scope = "llm_routing_anon"

    def get_rate(self) -> str | None:
        rate = (routing_settings.API_THROTTLE_RATES or {}).get("anon")
        return str(rate) if rate else None
