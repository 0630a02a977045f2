"""DRF throttles whose rates come from ``LLM_ROUTING["API_THROTTLE_RATES"]``, counted in
a fixed window: one counter per caller and window, one cache round trip per request.

DRF's ``SimpleRateThrottle`` keeps every request's timestamp for the whole window (a
GET and a SET of a list that grows with the rate). These throttles keep one integer:
on Redis (Django's backend), ``SET key 0 EX <window> NX`` + ``INCR key`` + ``PTTL key``
in one Lua script (``EVALSHA``) — one round trip, one command, atomic, and constant cost
whatever the rate; on any other backend, ``cache.add`` + ``cache.incr``. The window opens at a
caller's first request (not on a clock boundary) and lasts the rate's period; the
``N``-th request in it is the last one allowed, and a refused request's ``Retry-After``
is the time left in the window (:meth:`WindowRateThrottle.wait`). Rates are DRF's
strings (``"60/min"``, ``"10/s"``, ``"1000/day"``). The counters live in the routing
cache (``LLM_ROUTING["CACHE_ALIAS"]``, one shared client: :mod:`llm_routing.cache`), so
every worker process that shares it shares the counts. Under ASGI the async views call
:meth:`WindowRateThrottle.aallow_request`: the same script and keys through
``redis.asyncio`` on the event loop (LocMem inline, other backends in a worker thread).

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
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.core.cache.backends.locmem import LocMemCache
from rest_framework.throttling import BaseThrottle

from ..cache import CACHE_RETRY_S as _CACHE_RETRY_S
from ..cache import CacheBackoff, async_redis, raw_redis, routing_cache, run_script
from ..conf import routing_settings

__all__ = [
    "CACHE_RETRY_S",
    "FAIL_OPEN_LOG_INTERVAL_S",
    "AuditAnonThrottle",
    "AuditUserThrottle",
    "WindowRateThrottle",
]

logger = logging.getLogger("llm_routing.api")

#: While the throttle cache keeps failing, at most one warning per this many seconds.
FAIL_OPEN_LOG_INTERVAL_S = 60.0

#: After a cache failure, throttles do not touch the cache for this long (fail open).
CACHE_RETRY_S = _CACHE_RETRY_S

#: The throttles' cache-down back-off (:class:`llm_routing.cache.CacheBackoff`).
backoff = CacheBackoff(
    CACHE_RETRY_S, clock=lambda: time.monotonic(), log_interval_s=FAIL_OPEN_LOG_INTERVAL_S
)


def _cache_failed(scope: str, exc: Exception) -> None:
    backoff.failed()
    if not backoff.should_log():
        return
    logger.warning(
        "Throttle cache failed (%s); %s requests are not throttled until it answers again "
        "(fail open; next warning in %.0f s at the earliest).",
        type(exc).__name__,
        scope,
        FAIL_OPEN_LOG_INTERVAL_S,
    )


# KEYS[1]: the caller's window counter; ARGV[1]: the window in seconds.
# Returns {count in the window, milliseconds left in it}.
_WINDOW_LUA = """
redis.call('SET', KEYS[1], 0, 'EX', tonumber(ARGV[1]), 'NX')
local count = redis.call('INCR', KEYS[1])
return {count, redis.call('PTTL', KEYS[1])}
"""

#: Seconds of each period letter DRF's rate strings accept (``s``, ``min``, ``hour``, ``day``).
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str | None) -> tuple[int, int] | None:
    """``"60/min"`` → (60, 60): requests allowed per window, window length in seconds
    (DRF's syntax: the period's first letter counts)."""
    if rate is None:
        return None
    num, period = str(rate).split("/")
    return int(num), _PERIODS[period.strip()[0]]


class WindowRateThrottle(BaseThrottle):
    """A fixed-window counter per caller (see the module docstring). Subclasses set
    ``scope``, :meth:`get_rate` and :meth:`get_ident_key`."""

    scope = "llm_routing"
    timer = staticmethod(time.time)

    def __init__(self) -> None:
        self.rate = self.get_rate()
        parsed = parse_rate(self.rate)
        self.num_requests, self.duration = parsed if parsed else (0, 0)
        self.remaining_s: float | None = None

    def get_rate(self) -> str | None:
        raise NotImplementedError

    def get_ident_key(self, request: Any) -> str | None:
        """Who is counted (None: this throttle does not apply to the request)."""
        raise NotImplementedError

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        ident = self.get_ident_key(request)
        if ident is None:
            return True
        count, self.remaining_s = self._hit(f"llmr-throttle:{self.scope}:{ident}")
        return count <= self.num_requests

    async def aallow_request(self, request: Any, view: Any) -> bool:
        """:meth:`allow_request` on the event loop: one ``redis.asyncio`` script call (the
        same commands and keys as the sync path), LocMem inline, any other backend in
        a worker thread."""
        if self.rate is None:
            return True
        ident = self.get_ident_key(request)
        if ident is None:
            return True
        count, self.remaining_s = await self._ahit(f"llmr-throttle:{self.scope}:{ident}")
        return count <= self.num_requests

    async def _ahit(self, key: str) -> tuple[int, float]:
        cache = routing_cache()
        aredis = async_redis(cache)
        if aredis is not None:
            count, pttl = await aredis.run_script(
                _WINDOW_LUA, [cache.make_key(key)], [self.duration]
            )
            return self._counted(count, pttl)
        if isinstance(cache, LocMemCache):  # in process memory: nothing to wait on
            return self._hit(key)
        return await sync_to_async(self._hit, thread_sensitive=False)(key)

    def _hit(self, key: str) -> tuple[int, float]:
        """Count one request in ``key``'s window: (the count, seconds left in it)."""
        cache = routing_cache()
        client = raw_redis(cache)
        if client is not None:
            count, pttl = run_script(client, _WINDOW_LUA, [cache.make_key(key)], [self.duration])
            return self._counted(count, pttl)
        now = self.timer()
        start_key = f"{key}:start"
        if cache.add(start_key, now, self.duration):
            cache.set(key, 1, self.duration)
            return 1, float(self.duration)
        start = cache.get(start_key, now)
        try:
            count = cache.incr(key)
        except ValueError:  # the window ended between the two calls: a new one
            cache.set(start_key, now, self.duration)
            cache.set(key, 1, self.duration)
            return 1, float(self.duration)
        return int(count), max(0.0, float(start) + self.duration - now)

    def _counted(self, count: Any, pttl: Any) -> tuple[int, float]:
        pttl = int(pttl)
        return int(count), max(0.0, pttl / 1000.0) if pttl >= 0 else float(self.duration)

    def wait(self) -> float | None:
        """Seconds until the caller's window ends (the 429's ``Retry-After``)."""
        return self.remaining_s


class _FailOpen(WindowRateThrottle):
    def allow_request(self, request: Any, view: Any) -> bool:
        if not backoff.open():
            return True  # the cache failed moments ago: fail open without waiting on it
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # the cache, whatever its backend raises
            _cache_failed(str(self.scope), exc)
            return True

    async def aallow_request(self, request: Any, view: Any) -> bool:
        if not backoff.open():
            return True
        try:
            return await super().aallow_request(request, view)
        except Exception as exc:
            _cache_failed(str(self.scope), exc)
            return True


def _authenticated(request: Any) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated)


class AuditUserThrottle(_FailOpen):
    """Per user (per client address for an anonymous caller): ``API_THROTTLE_RATES
    ["user"]``."""

    scope = "llm_routing_user"

    def get_rate(self) -> str | None:
        rate = (routing_settings.API_THROTTLE_RATES or {}).get("user")
        return str(rate) if rate else None

    def get_ident_key(self, request: Any) -> str | None:
        if _authenticated(request):
            return f"u{request.user.pk}"
        return f"a{self.get_ident(request)}"


class AuditAnonThrottle(_FailOpen):
    """Per client address, anonymous callers only: ``API_THROTTLE_RATES["anon"]``."""

    scope = "llm_routing_anon"

    def get_rate(self) -> str | None:
        rate = (routing_settings.API_THROTTLE_RATES or {}).get("anon")
        return str(rate) if rate else None

    def get_ident_key(self, request: Any) -> str | None:
        if _authenticated(request):
            return None
        return f"a{self.get_ident(request)}"
