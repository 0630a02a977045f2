"""Budgets: hard caps on requests, tokens and cost per user, group, API token or
everyone, per window (docs/budgets.md).

* **Before the walk** :func:`check` finds the enabled :class:`~llm_routing.models.Budget`
  rows that apply to the caller (their user, each of their groups, their API token, the
  global ones) and, in ONE atomic step, checks every one against its caps and counts
  the request in all of them — or in none, when any is exhausted (the first exhausted
  one is the :class:`Refusal`). On Redis (the app's own client, :mod:`llm_routing.cache`)
  the step is one Lua script, so it holds across workers and hosts; on any other cache
  (LocMem in the embedded setup) it is the cache's own operations under a process lock — the same
  semantics within one process, per process across several.
* **After the answer** the routed request's tokens and cost (every attempt's, from
  ``request_routed``; the cost from :mod:`llm_routing.pricing`) are added to the same
  window counters (:func:`settle`). A budget with a tokens or cost cap also keeps the
  requests in flight in it (a set in the cache, each with a lease) and the largest
  usage one request has settled in it (its *peak*): a request is let in only while
  ``used + in_flight * peak`` stays under the cap (while the peak is unknown, only when
  none is in flight). So such a cap is overshot by at most one request's usage, unless
  a request uses more than the peak; a request cap is never overshot.
* **Windows** are UTC calendar windows (minute, hour, day, month) keyed by their start;
  the keys expire shortly after the window ends.
* **Soft threshold**: :data:`budget_threshold_reached` fires once per budget and window,
  from the request whose counting crosses ``soft_threshold * cap`` (any of the caps).
* **Cache down** (the policy of docs/operations.md, per budget): ``on_cache_down =
  "open"`` lets the request through and logs a warning (at most one per minute per
  process); ``"closed"`` refuses it with **503** (the budget is not exceeded, it cannot
  be checked). After a failure the cache is left alone for :data:`CACHE_RETRY_S`.

Counter keys carry the budget's name, never its subject (a token key is a secret).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.cache.backends.locmem import LocMemCache
from django.db import close_old_connections
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal

from .cache import CACHE_RETRY_S as _CACHE_RETRY_S
from .cache import (
    CacheBackoff,
    SharedStore,
    async_redis,
    raw_redis,
    routing_cache,
    run_script,
)
from .conf import routing_settings
from .models import Budget
from .signals import defer, deferring, send
from .types import Principal, RoutingResult

__all__ = [
    "CACHE_RETRY_S",
    "ROWS_TTL_S",
    "Grant",
    "Refusal",
    "Room",
    "Usage",
    "acheck",
    "applicable",
    "budget_threshold_reached",
    "check",
    "clock",
    "forget",
    "reset_cache_state",
    "room",
    "settle",
    "usage",
    "window_bounds",
]

logger = logging.getLogger("llm_routing.budgets")
T = TypeVar("T")

#: ``budget_threshold_reached(sender, name, scope, subject, window, used, cap, metric)``:
#: a budget's use crossed its soft threshold (once per budget and window).
budget_threshold_reached = Signal()

#: After a cache failure, budgets leave the cache alone for this long (the app's one
#: cache-down back-off: :class:`llm_routing.cache.CacheBackoff`).
CACHE_RETRY_S = _CACHE_RETRY_S
#: While the cache keeps failing, at most one warning per this many seconds.
FAIL_OPEN_LOG_INTERVAL_S = 60.0
#: Counter keys outlive their window by this much (late settlements still land).
KEY_GRACE_S = 120
#: Retry-After of a request refused while the requests in flight hold a budget's room.
IN_FLIGHT_RETRY_S = 1
#: Cost is counted in nano-dollars (integers: atomic INCRBY, exact sums); a request's
#: cost is rounded up to the next nano-dollar, so sums never undercount.
NANO = 1_000_000_000

#: Seconds since the epoch; tests replace it to roll windows over.
clock: Callable[[], float] = time.time

METRICS = ("requests", "tokens", "cost")


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the budget, its window and when it resets."""

    budget: str
    window: str
    reset_at: datetime | None
    detail: str
    status: int = 429
    code: str = "budget_exceeded"
    #: Retry-After when it is not the window's reset (requests in flight).
    retry_s: int | None = None

    @property
    def retry_after(self) -> int:
        """Seconds until the window resets (at least 1)."""
        if self.retry_s is not None:
            return self.retry_s
        if self.reset_at is None:
            return int(CACHE_RETRY_S)
        return max(1, math.ceil(self.reset_at.timestamp() - clock()))

    def body(self) -> dict[str, Any]:
        """The 429 (or 503) body of ``/audit/``."""
        return {
            "budget": self.budget,
            "window": self.window,
            "reset_at": self.reset_at.isoformat().replace("+00:00", "Z") if self.reset_at else None,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Usage:
    """One budget's counters in its current window."""

    requests: int = 0
    tokens: int = 0
    cost_usd: Decimal = Decimal(0)


@dataclass(frozen=True)
class Room:
    """What a request's tokens and cost caps had left for it when it was admitted: per
    metric, the smallest ``cap - used - (other requests in flight) * peak`` over its
    budgets with that cap (the room admission checked; at least 1 when admitted).
    None: no budget of the request caps that metric."""

    tokens: int | None = None
    nano_usd: int | None = None

    def holds(self, tokens: int, nano_usd: int) -> bool:
        """Whether this room can take ``tokens`` and ``nano_usd`` more (an uncapped
        metric always can)."""
        return (self.tokens is None or tokens <= self.tokens) and (
            self.nano_usd is None or nano_usd <= self.nano_usd
        )


@dataclass
class Grant:
    """The budgets a request was counted in (their window keys), settled after the answer.

    ``member`` names the request in the in-flight set of each budget with a tokens or
    cost cap (released when it is settled or forgotten); ``room``: what those caps had
    left for it at admission (read by the router's hedging, :func:`room`)."""

    budgets: list[Budget] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    member: str = ""
    released: bool = False
    room: Room = Room()


# --- windows and keys -------------------------------------------------------------------


def window_bounds(window: str, now: float) -> tuple[datetime, datetime]:
    """The UTC start and end of the window containing ``now``."""
    t = datetime.fromtimestamp(now, UTC)
    if window == "minute":
        start = t.replace(second=0, microsecond=0)
        return start, datetime.fromtimestamp(start.timestamp() + 60, UTC)
    if window == "hour":
        start = t.replace(minute=0, second=0, microsecond=0)
        return start, datetime.fromtimestamp(start.timestamp() + 3600, UTC)
    if window == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, datetime.fromtimestamp(start.timestamp() + 86400, UTC)
    start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, end


def _key(budget: Budget, start: int, metric: str) -> str:
    return f"llmr:budget:{budget.name}:{budget.window}:{start}:{metric}"


def _peak_key(budget: Budget, metric: str) -> str:
    """The largest tokens / cost one request has used in this budget (any window)."""
    return f"llmr:budget:{budget.name}:peak:{metric}"


def _reserves(budget: Budget) -> bool:
    """Whether the budget holds room for requests in flight (it caps tokens or cost)."""
    return budget.max_tokens is not None or budget.max_cost_usd is not None


def _ttl(budget: Budget, now: float) -> int:
    _, end = window_bounds(budget.window, now)
    return max(1, math.ceil(end.timestamp() - now)) + KEY_GRACE_S


def _caps(budget: Budget) -> tuple[int, int, int]:
    """(requests, tokens, nano-USD) caps; -1 for none."""
    cost = -1 if budget.max_cost_usd is None else int(Decimal(budget.max_cost_usd) * NANO)
    return (
        -1 if budget.max_requests is None else int(budget.max_requests),
        -1 if budget.max_tokens is None else int(budget.max_tokens),
        cost,
    )


# --- which budgets apply ----------------------------------------------------------------


#: Each process keeps the enabled budget rows this long (a change made in another
#: process, or a renamed user or group, applies within it; a Budget saved in this
#: process applies at once, through the model's signals).
ROWS_TTL_S = 1.0


@dataclass(frozen=True)
class _Index:
    """The enabled budgets, indexed by what a request carries (user and group pks, the
    token key): names are resolved to pks once per load, not per request."""

    any: bool = False
    everyone: tuple[Budget, ...] = ()
    by_user: dict[str, tuple[Budget, ...]] = field(default_factory=dict)
    by_group: dict[str, tuple[Budget, ...]] = field(default_factory=dict)
    by_token: dict[str, tuple[Budget, ...]] = field(default_factory=dict)


_rows_lock = threading.Lock()
_rows: tuple[float, _Index] | None = None


def _load() -> _Index:
    rows = list(Budget.objects.filter(enabled=True).order_by("name"))
    if not rows:
        return _Index()
    by: dict[str, dict[str, list[Budget]]] = {"user": {}, "group": {}, "token": {}}
    users = {b.subject for b in rows if b.scope == Budget.Scope.USER}
    groups = {b.subject for b in rows if b.scope == Budget.Scope.GROUP}
    user_pks: dict[str, list[str]] = {}
    group_pks: dict[str, list[str]] = {}
    if users:
        from django.contrib.auth import get_user_model

        model = get_user_model()
        field_name = model.USERNAME_FIELD
        for pk, name in model._default_manager.filter(**{f"{field_name}__in": users}).values_list(
            "pk", field_name
        ):
            user_pks.setdefault(str(name), []).append(str(pk))
    if groups:
        from django.contrib.auth.models import Group

        for pk, name in Group.objects.filter(name__in=groups).values_list("pk", "name"):
            group_pks.setdefault(name, []).append(str(pk))
    everyone: list[Budget] = []
    for b in rows:
        if b.scope == Budget.Scope.GLOBAL:
            everyone.append(b)
        elif b.scope == Budget.Scope.TOKEN:
            by["token"].setdefault(b.subject, []).append(b)
        else:
            pks = (user_pks if b.scope == Budget.Scope.USER else group_pks).get(b.subject, [])
            for pk in pks:
                by[b.scope].setdefault(pk, []).append(b)
    return _Index(
        any=True,
        everyone=tuple(everyone),
        by_user={k: tuple(v) for k, v in by["user"].items()},
        by_group={k: tuple(v) for k, v in by["group"].items()},
        by_token={k: tuple(v) for k, v in by["token"].items()},
    )


def _index() -> _Index:
    """The enabled budgets (two or three queries per :data:`ROWS_TTL_S` per process;
    none in between)."""
    global _rows
    now = time.monotonic()
    cached = _rows
    if cached is not None and now - cached[0] < ROWS_TTL_S:
        return cached[1]
    index = _load()
    with _rows_lock:
        _rows = (now, index)
    return index


def _rows_changed(**kwargs: Any) -> None:
    global _rows
    with _rows_lock:
        _rows = None


def applicable(
    principal: Principal | None, token_key: str | None = None, index: _Index | None = None
) -> list[Budget]:
    """The enabled budgets of this caller, global ones included, by name (no query
    while the process's copy of the rows is fresh; none at all given ``index``)."""
    index = index if index is not None else _index()
    if not index.any:
        return []
    found: dict[str, Budget] = {b.name: b for b in index.everyone}
    if token_key:
        found.update((b.name, b) for b in index.by_token.get(token_key, ()))
    if principal is not None and principal.user_id is not None:
        found.update((b.name, b) for b in index.by_user.get(str(principal.user_id), ()))
        for gid in principal.group_ids:
            found.update((b.name, b) for b in index.by_group.get(str(gid), ()))
    return [found[name] for name in sorted(found)]


# --- the counters -----------------------------------------------------------------------

#: Checked before the walk, in one step: a budget is exhausted once a counter has
#: reached its cap; and a budget with a tokens or cost cap also refuses while the
#: requests in flight in it could use the rest of the room — each counted at the
#: largest usage one request has settled in the budget (its peak; unknown before the
#: first settlement, when one request at a time is let in). So a tokens or cost cap is
#: overshot by at most one request's usage, as long as no request uses more than the
#: peak (docs/budgets.md).
#:
#: KEYS: per budget i (0-based) at 6i+1 … 6i+6: requests, tokens, cost, the in-flight
#: set (member → lease end, ms), peak tokens, peak cost.
#: ARGV: n, now (ms), lease end (ms), member, then per budget at 5+4i … 8+4i: ttl,
#: max_requests, max_tokens, max_nano_usd (-1: none).
#: Returns {0, requests_1 … requests_n, then per budget its room in tokens and in
#: nano-USD (cap - used - in flight * peak; -1: no such cap)} when counted, {i} for the
#: first exhausted budget (1-based), else {-i} for the first whose room is held by
#: requests in flight
#: (an exhausted budget is the better answer: it will not change in a second) —
#: nothing is counted then.
_CHECK_LUA = """
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local used = {}
for i = 0, n - 1 do
  local k, a = i * 6, 5 + i * 4
  local mr, mt, mc = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local r = tonumber(redis.call('GET', KEYS[k + 1]) or '0')
  local t = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local c = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
  if (mr >= 0 and r + 1 > mr) or (mt >= 0 and t >= mt) or (mc >= 0 and c >= mc) then
    return {i + 1}
  end
  used[i] = {t, c}
end
local room = {}
for i = 0, n - 1 do
  local k, a = i * 6, 5 + i * 4
  local mt, mc = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local t, c = used[i][1], used[i][2]
  local rt, rc = -1, -1
  if mt >= 0 or mc >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[k + 4], '-inf', now)
    local f = redis.call('ZCARD', KEYS[k + 4])
    local ht, hc = 0, 0
    if f > 0 then
      local pt = redis.call('GET', KEYS[k + 5])
      local pc = redis.call('GET', KEYS[k + 6])
      if (mt >= 0 and ((not pt) or t + f * tonumber(pt) >= mt))
          or (mc >= 0 and ((not pc) or c + f * tonumber(pc) >= mc)) then
        return {-(i + 1)}
      end
      if mt >= 0 then ht = f * tonumber(pt) end
      if mc >= 0 then hc = f * tonumber(pc) end
    end
    if mt >= 0 then rt = mt - t - ht end
    if mc >= 0 then rc = mc - c - hc end
  end
  room[i] = {rt, rc}
end
local out = {0}
for i = 0, n - 1 do
  local k, a = i * 6, 5 + i * 4
  local r = redis.call('INCR', KEYS[k + 1])
  if r == 1 then redis.call('EXPIRE', KEYS[k + 1], tonumber(ARGV[a])) end
  if tonumber(ARGV[a + 2]) >= 0 or tonumber(ARGV[a + 3]) >= 0 then
    redis.call('ZADD', KEYS[k + 4], tonumber(ARGV[3]), ARGV[4])
    redis.call('EXPIRE', KEYS[k + 4], tonumber(ARGV[a]))
  end
  out[#out + 1] = r
end
for i = 0, n - 1 do
  out[#out + 1] = room[i][1]
  out[#out + 1] = room[i][2]
end
return out
"""

#: After the answer, in one step: add the request's tokens and cost to every budget it
#: was counted in, and, in those that hold room for requests in flight, raise the peaks
#: and take the request out of the in-flight set. Only a request that used tokens says
#: anything about the peaks (an attempt that failed before any answer used none: a
#: zero from it would let everything in); its cost may be 0 (a free or unpriced model).
#:
#: KEYS: per budget i at 5i+1 … 5i+5: tokens, cost, in-flight set, peak tokens, peak
#: cost. ARGV: member, tokens, nano-USD, peak ttl, then per budget at 5+2i, 6+2i: ttl,
#: holds room (1/0). Returns the new tokens and cost counters, per budget.
_SETTLE_LUA = """
local member, pttl = ARGV[1], tonumber(ARGV[4])
local used = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local out = {}
for i = 0, #KEYS / 5 - 1 do
  local k, ttl, holds = i * 5, tonumber(ARGV[5 + 2 * i]), ARGV[6 + 2 * i] == '1'
  for j = 1, 2 do
    local v = redis.call('INCRBY', KEYS[k + j], used[j])
    if redis.call('TTL', KEYS[k + j]) < 0 then redis.call('EXPIRE', KEYS[k + j], ttl) end
    out[#out + 1] = v
    if holds then
      local p = redis.call('GET', KEYS[k + 3 + j])
      if used[1] > 0 and ((not p) or tonumber(p) < used[j]) then
        redis.call('SET', KEYS[k + 3 + j], used[j], 'EX', pttl)
      elseif p then
        redis.call('EXPIRE', KEYS[k + 3 + j], pttl)
      end
    end
  end
  if holds then redis.call('ZREM', KEYS[k + 3], member) end
end
return out
"""

#: A peak outlives the windows: the next window starts with what this one learnt.
PEAK_TTL_S = 40 * 86400
#: A request's place in the in-flight sets lasts this much past the request deadline
#: (a worker that died mid-request holds its place no longer).
LEASE_GRACE_S = 30.0

_lock = threading.Lock()


def _cache() -> SharedStore:
    """The routing store (:func:`llm_routing.cache.routing_cache`): the app's own Redis
    client, the process's LocMem cache, or Django's cache for another backend."""
    return routing_cache()


def _redis(cache: SharedStore) -> Any | None:
    """The shared redis-py client of the routing store, or None when it is not Redis."""
    return raw_redis(cache)


def _start(budget: Budget, now: float) -> int:
    return int(window_bounds(budget.window, now)[0].timestamp())


def _keys(budgets: Sequence[Budget], starts: Sequence[int]) -> list[str]:
    return [_key(b, s, m) for b, s in zip(budgets, starts, strict=True) for m in METRICS]


def _exhausted(budget: Budget, r: int, t: int, c: int) -> bool:
    mr, mt, mc = _caps(budget)
    return (mr >= 0 and r + 1 > mr) or (mt >= 0 and t >= mt) or (mc >= 0 and c >= mc)


def _held(budget: Budget, t: int, c: int, flying: int, peaks: tuple[int | None, ...]) -> bool:
    """Whether the requests in flight could use the rest of the room (see _CHECK_LUA)."""
    if flying == 0:
        return False
    _, mt, mc = _caps(budget)
    pt, pc = peaks
    return (mt >= 0 and (pt is None or t + flying * pt >= mt)) or (
        mc >= 0 and (pc is None or c + flying * pc >= mc)
    )


def _lease_s() -> float:
    return float(routing_settings.REQUEST_DEADLINE_S) + LEASE_GRACE_S


def _check_call(
    cache: SharedStore, budgets: Sequence[Budget], starts: Sequence[int], now: float, member: str
) -> tuple[list[str], list[int | str]]:
    """The keys and arguments of :data:`_CHECK_LUA` (the cache's key prefix applied)."""
    keys: list[str] = []
    args: list[int | str] = [
        len(budgets),
        int(now * 1000),
        int((now + _lease_s()) * 1000),
        member,
    ]
    for b, start in zip(budgets, starts, strict=True):
        keys += [_key(b, start, m) for m in (*METRICS, "inflight")]
        keys += [_peak_key(b, "tokens"), _peak_key(b, "cost")]
        args += [_ttl(b, now), *_caps(b)]
    return [cache.make_key(k) for k in keys], args


def _room(pairs: Sequence[int]) -> Room:
    """The :class:`Room` of :data:`_CHECK_LUA`'s per-budget (tokens, nano-USD) rooms."""
    tokens = [r for r in pairs[0::2] if r >= 0]
    nano = [r for r in pairs[1::2] if r >= 0]
    return Room(min(tokens) if tokens else None, min(nano) if nano else None)


def _count(
    cache: SharedStore, budgets: Sequence[Budget], starts: Sequence[int], now: float, member: str
) -> tuple[int, list[int], Room]:
    """Check and count one request in every budget: (0, new request counts, the room
    its tokens and cost caps have left), or the 1-based index of the first exhausted
    budget (negative: its room is held by the requests in flight), [] and no room."""
    lease_until = now + _lease_s()
    client = _redis(cache)
    if client is not None:
        keys, args = _check_call(cache, budgets, starts, now, member)
        reply = [int(v) for v in run_script(client, _CHECK_LUA, keys, args)]
        n = len(budgets)
        return reply[0], reply[1 : n + 1], _room(reply[n + 1 :])
    with _lock:  # LocMem & co: atomic within this process only
        keys = _keys(budgets, starts)
        values = cache.get_many(keys)
        used = [
            tuple(int(values.get(keys[3 * i + j]) or 0) for j in range(3))
            for i in range(len(budgets))
        ]
        for i, b in enumerate(budgets):
            if _exhausted(b, *used[i]):
                return i + 1, [], Room()
        flying: list[dict[str, float]] = []
        rooms: list[int] = []
        for i, b in enumerate(budgets):
            _, t, c = used[i]
            members: dict[str, float] = {}
            pair: tuple[int | None, int | None] = (None, None)
            if _reserves(b):
                held = cache.get(_key(b, starts[i], "inflight")) or {}
                members = {m: until for m, until in held.items() if until > now}
                peaks = cache.get_many([_peak_key(b, "tokens"), _peak_key(b, "cost")])
                pair = (peaks.get(_peak_key(b, "tokens")), peaks.get(_peak_key(b, "cost")))
                if _held(b, t, c, len(members), pair):
                    return -(i + 1), [], Room()
            _, mt, mc = _caps(b)
            f = len(members)
            rooms += [-1 if mt < 0 else mt - t - f * (pair[0] or 0)]
            rooms += [-1 if mc < 0 else mc - c - f * (pair[1] or 0)]
            flying.append(members)
        counts: list[int] = []
        for i, b in enumerate(budgets):
            counts.append(int(values.get(keys[3 * i]) or 0) + 1)
            cache.set(keys[3 * i], counts[-1], _ttl(b, now))
            if _reserves(b):
                flying[i][member] = lease_until
                cache.set(_key(b, starts[i], "inflight"), flying[i], _ttl(b, now))
    return 0, counts, _room(rooms)


def _settle_call(
    cache: SharedStore, grant: Grant, tokens: int, nano: int, now: float
) -> tuple[list[str], list[int | str]]:
    """The keys and arguments of :data:`_SETTLE_LUA` (the cache's key prefix applied)."""
    keys: list[str] = []
    args: list[int | str] = [grant.member, tokens, nano, PEAK_TTL_S]
    for b, start in zip(grant.budgets, grant.starts, strict=True):
        keys += [_key(b, start, m) for m in ("tokens", "cost", "inflight")]
        keys += [_peak_key(b, "tokens"), _peak_key(b, "cost")]
        args += [_ttl(b, now), 1 if _reserves(b) else 0]
    return [cache.make_key(k) for k in keys], args


def _settle(cache: SharedStore, grant: Grant, tokens: int, nano: int, now: float) -> list[int]:
    """Add the usage to the grant's budgets and release its places in flight, one round
    trip on Redis; the new (tokens, cost) counters, per budget."""
    client = _redis(cache)
    if client is not None:
        keys, args = _settle_call(cache, grant, tokens, nano, now)
        return [int(v) for v in run_script(client, _SETTLE_LUA, keys, args)]
    out: list[int] = []
    with _lock:
        for b, start in zip(grant.budgets, grant.starts, strict=True):
            ttl = _ttl(b, now)
            for metric, used in (("tokens", tokens), ("cost", nano)):
                key = _key(b, start, metric)
                out.append(int(cache.get(key) or 0) + used)
                cache.set(key, out[-1], ttl)
                if _reserves(b) and tokens > 0:
                    peak = cache.get(_peak_key(b, metric))
                    cache.set(_peak_key(b, metric), max(used, peak or 0), PEAK_TTL_S)
            if _reserves(b):
                _release_locally(cache, b, start, grant.member, ttl)
    return out


def _release_locally(cache: SharedStore, budget: Budget, start: int, member: str, ttl: int) -> None:
    key = _key(budget, start, "inflight")
    held = dict(cache.get(key) or {})
    if held.pop(member, None) is not None:
        if held:
            cache.set(key, held, ttl)
        else:
            cache.delete(key)


def _release(cache: SharedStore, grant: Grant) -> None:
    """Take an unsettled request out of the in-flight sets (one round trip on Redis)."""
    held = [(b, s) for b, s in zip(grant.budgets, grant.starts, strict=True) if _reserves(b)]
    if not held:
        return
    client = _redis(cache)
    if client is not None:
        pipe = client.pipeline(transaction=False)
        for b, start in held:
            pipe.zrem(cache.make_key(_key(b, start, "inflight")), grant.member)
        pipe.execute()
        return
    now = clock()
    with _lock:
        for b, start in held:
            _release_locally(cache, b, start, grant.member, _ttl(b, now))


# --- cache failures -----------------------------------------------------------------------

#: The budgets' cache-down back-off (one warning per FAIL_OPEN_LOG_INTERVAL_S).
backoff = CacheBackoff(
    CACHE_RETRY_S, clock=lambda: time.monotonic(), log_interval_s=FAIL_OPEN_LOG_INTERVAL_S
)


def _cache_failed(exc: Exception | None) -> None:
    if exc is not None:
        backoff.failed()
    if not backoff.should_log():
        return
    logger.warning(
        "Budget cache unavailable (%s); budgets with on_cache_down=open let requests "
        "through, closed ones refuse them (503) until it answers again.",
        type(exc).__name__ if exc is not None else "retrying later",
    )


def reset_cache_state() -> None:
    """Forget a past cache failure and the cached budget rows (tests: the next call
    tries the cache again and reads the rows)."""
    backoff.reset()
    _rows_changed()


def _cache_down_refusal(budgets: Sequence[Budget]) -> Refusal | None:
    closed = [b for b in budgets if b.on_cache_down == Budget.OnCacheDown.CLOSED]
    if not closed:
        return None
    return Refusal(
        budget=closed[0].name,
        window=closed[0].window,
        reset_at=None,
        detail="The budget counters are unavailable and this budget fails closed; "
        "try again shortly.",
        status=503,
        code="budget_unavailable",
    )


# --- the entry points ---------------------------------------------------------------------

#: The budgets the current request was counted in, settled after the answer.
_current: contextvars.ContextVar[Grant | None] = contextvars.ContextVar(
    "llm_routing_budget_grant", default=None
)


def check(principal: Principal | None, token_key: str | None = None) -> Refusal | None:
    """Count one request in every budget of this caller, or refuse it (nothing counted).

    Remembers the budgets counted in for :func:`settle` (a context variable: the
    router's answer in the same request settles them)."""
    return _check(principal, token_key, None)


def _check(
    principal: Principal | None, token_key: str | None, index: _Index | None
) -> Refusal | None:
    step = _begin(principal, token_key, index)
    if not isinstance(step, _Counting):
        return step
    try:
        refused, counts, left = _count(_cache(), step.budgets, step.starts, step.now, step.member)
    except Exception as exc:  # the cache, whatever its backend raises
        _cache_failed(exc)
        return _cache_down_refusal(step.budgets)
    if refused:
        return _refusal(step, refused)
    for crossing in _request_crossings(step, counts):
        _crossed(*crossing)
    _granted(step, left)
    return None


def _in_worker(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` in a worker thread of the loop's executor, its database connection then
    handled as at the end of a request (``close_old_connections``: closed, or back to
    the pool, unless ``CONN_MAX_AGE`` keeps it). The budget rows' re-read and a soft
    threshold's receivers query the database there; the executor's threads outlive the
    request, and a connection left open in one stayed open (a pool slot held) until
    the thread was collected."""

    def run(*args: Any) -> T:
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return sync_to_async(run, thread_sensitive=False)


async def acheck(principal: Principal | None, token_key: str | None = None) -> Refusal | None:
    """:func:`check` for code on the event loop, with the same counting and answers.

    On Redis the Lua step runs through ``redis.asyncio`` (one round trip, on the loop);
    with no enabled budget nothing is awaited at all. What would block the loop runs
    :func:`check` in a worker thread instead: the budget rows due for a re-read
    (every :data:`ROWS_TTL_S`), a cache that is neither Redis nor LocMem. A soft
    threshold crossed (once per budget and window) is flagged in a worker thread."""
    cache = routing_cache()
    aredis = async_redis(cache)
    # The rows are read once here: re-reading them in _begin could find them expired a
    # moment later and query the database on the event loop.
    index = _fresh_index()
    if index is None or (aredis is None and not isinstance(cache, LocMemCache)):
        return await _in_worker(check)(principal, token_key)
    if aredis is None:  # LocMem: in process memory, nothing to wait on
        return _check(principal, token_key, index)
    step = _begin(principal, token_key, index)
    if not isinstance(step, _Counting):
        return step
    keys, args = _check_call(cache, step.budgets, step.starts, step.now, step.member)
    try:
        reply = [int(v) for v in await aredis.run_script(_CHECK_LUA, keys, args)]
    except Exception as exc:  # the cache, whatever its backend raises
        _cache_failed(exc)
        return _cache_down_refusal(step.budgets)
    if reply[0]:
        return _refusal(step, reply[0])
    n = len(step.budgets)
    for crossing in _request_crossings(step, reply[1 : n + 1]):
        await _in_worker(_crossed)(*crossing)
    _granted(step, _room(reply[n + 1 :]))
    return None


@dataclass(frozen=True)
class _Counting:
    """A request about to be counted: its budgets, the time, each window's start, and
    its name in the budgets' in-flight sets."""

    budgets: list[Budget]
    now: float
    starts: list[int]
    member: str


def _begin(
    principal: Principal | None, token_key: str | None, index: _Index | None = None
) -> _Counting | Refusal | None:
    """The budgets to count the request in, or the answer already (None: let it through,
    no budget applies or the cache is down and they fail open). ``index``: the rows
    already read (no query); else they are read or re-read as :func:`applicable` does."""
    forget()  # a grant left over in this context (never settled) gives its place back
    budgets = applicable(principal, token_key, index)
    if not budgets:
        return None
    now = clock()
    if not backoff.open():
        _cache_failed(None)
        return _cache_down_refusal(budgets)
    return _Counting(
        budgets=budgets,
        now=now,
        starts=[_start(b, now) for b in budgets],
        member=uuid.uuid4().hex,
    )


def _request_crossings(
    step: _Counting, counts: Sequence[int]
) -> list[tuple[Budget, int, str, int, int, int]]:
    """The :func:`_crossed` calls due for the new request counts (soft thresholds)."""
    return [
        (b, start, "requests", count - 1, count, b.max_requests)
        for b, start, count in zip(step.budgets, step.starts, counts, strict=True)
        if b.max_requests is not None and _crosses(b, count - 1, count, b.max_requests)
    ]


def _granted(step: _Counting, room: Room) -> None:
    _current.set(Grant(budgets=step.budgets, starts=step.starts, member=step.member, room=room))


def room() -> Room | None:
    """What the current request's tokens and cost caps had left for it when it was
    admitted (:func:`check` in this context); None when it is under no such cap. Read
    from memory: no cache round trip."""
    grant = _current.get()
    if grant is None or grant.released:
        return None
    found = grant.room
    return None if found.tokens is None and found.nano_usd is None else found


def _fresh_index() -> _Index | None:
    """The process's copy of the rows while it is fresh, else None (never a query)."""
    cached = _rows
    if cached is not None and time.monotonic() - cached[0] < ROWS_TTL_S:
        return cached[1]
    return None


def _refusal(step: _Counting, refused: int) -> Refusal:
    """The refusal for the check's answer: budget ``refused`` (1-based) is exhausted, or
    (negative) its room is held by the requests in flight."""
    if refused < 0:
        budget = step.budgets[-refused - 1]
        return Refusal(
            budget=budget.name,
            window=budget.window,
            reset_at=None,
            detail=f"Budget {budget.name!r} is close to its cap and the requests in flight "
            "may use the rest; try again in a moment.",
            code="budget_in_flight",
            retry_s=IN_FLIGHT_RETRY_S,
        )
    budget = step.budgets[refused - 1]
    _, end = window_bounds(budget.window, step.now)
    return Refusal(
        budget=budget.name,
        window=budget.window,
        reset_at=end,
        detail=f"Budget {budget.name!r} is exhausted for this {budget.window}; it resets at "
        f"{end.isoformat().replace('+00:00', 'Z')}.",
    )


def settle(tokens: int, cost_usd: Decimal | float | None = None) -> None:
    """Add usage (tokens, and the cost when known) to the budgets :func:`check` counted
    the current request in, and end its place in flight there. A no-op outside such a
    request, and for a request already settled."""
    grant = _current.get()
    if grant is None or grant.released:
        return
    grant.released = True
    _settle_grant(grant, *_amounts(tokens, cost_usd))


def _amounts(tokens: int, cost_usd: Decimal | float | None) -> tuple[int, int]:
    """(tokens, nano-USD), never negative; a cost is rounded up to the nano-dollar."""
    nano = 0 if cost_usd is None else math.ceil(Decimal(str(cost_usd)) * NANO)
    return max(0, tokens), max(0, nano)


def _settle_grant(grant: Grant, tokens: int, nano: int) -> None:
    if (tokens <= 0 and nano <= 0) and not any(_reserves(b) for b in grant.budgets):
        return
    try:
        values = _settle(_cache(), grant, tokens, nano, clock())
    except Exception as exc:
        _cache_failed(exc)
        return
    for crossing in _usage_crossings(grant, tokens, nano, values):
        _crossed(*crossing)


async def _asettle(grant: Grant, tokens: int, nano: int) -> None:
    """:func:`_settle_grant` from the event loop: on Redis the Lua step through
    ``redis.asyncio`` (no thread), else in a worker thread; a soft threshold crossed is
    flagged in a worker thread."""
    cache = routing_cache()
    aredis = async_redis(cache)
    if aredis is None:
        await _in_worker(_settle_grant)(grant, tokens, nano)
        return
    if (tokens <= 0 and nano <= 0) and not any(_reserves(b) for b in grant.budgets):
        return
    keys, args = _settle_call(cache, grant, tokens, nano, clock())
    try:
        values = [int(v) for v in await aredis.run_script(_SETTLE_LUA, keys, args)]
    except Exception as exc:  # the cache, whatever its backend raises
        _cache_failed(exc)
        return
    for crossing in _usage_crossings(grant, tokens, nano, values):
        await _in_worker(_crossed)(*crossing)


def _usage_crossings(
    grant: Grant, tokens: int, nano: int, values: Sequence[int]
) -> list[tuple[Budget, int, str, int, int, int]]:
    """The :func:`_crossed` calls due for the new tokens and cost counters."""
    out: list[tuple[Budget, int, str, int, int, int]] = []
    for i, (b, start) in enumerate(zip(grant.budgets, grant.starts, strict=True)):
        if b.max_tokens is not None:
            t, cap = values[2 * i], int(b.max_tokens)
            if _crosses(b, t - tokens, t, cap):
                out.append((b, start, "tokens", t - tokens, t, cap))
        if b.max_cost_usd is not None:
            c, cap = values[2 * i + 1], int(Decimal(b.max_cost_usd) * NANO)
            if _crosses(b, c - nano, c, cap):
                out.append((b, start, "cost", c - nano, c, cap))
    return out


#: Settlements under way on an event loop (a task is kept until it is done).
_settling: set[asyncio.Task[None]] = set()


def _crosses(budget: Budget, before: int, after: int, cap: int) -> bool:
    return before < budget.soft_threshold * cap <= after


def _crossed(budget: Budget, start: int, metric: str, before: int, after: int, cap: int) -> None:
    if not _crosses(budget, before, after, cap):
        return
    flag = _key(budget, start, "soft")
    try:
        first = _cache().add(flag, 1, _ttl(budget, clock()))
    except Exception as exc:
        _cache_failed(exc)
        return
    if not first:
        return  # another metric (or process) crossed first in this window
    used: int | Decimal = after
    capped: int | Decimal = cap
    if metric == "cost":
        used, capped = Decimal(after) / NANO, Decimal(cap) / NANO
    send(
        budget_threshold_reached,
        name=budget.name,
        scope=budget.scope,
        subject=budget.subject,
        window=budget.window,
        used=used,
        cap=capped,
        metric=metric,
    )


def forget() -> None:
    """End the current request's grant (its answer was settled or never came: then its
    places in flight are released — in a worker thread when called on an event loop,
    which never waits on the cache here)."""
    grant = _current.get()
    if grant is None:
        return
    _current.set(None)
    if grant.released:
        return
    grant.released = True
    if not any(_reserves(b) for b in grant.budgets):
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _release_quietly(grant)
        return
    loop.run_in_executor(None, _release_quietly, grant)


def _release_quietly(grant: Grant) -> None:
    try:
        _release(_cache(), grant)
    except Exception as exc:  # the cache: the lease ends the place anyway
        _cache_failed(exc)


def _used(routed: RoutingResult) -> tuple[int, Decimal]:
    """A routed request's tokens and cost, every attempt's (a failed attempt that
    consumed tokens counts too): the cost of the attempts whose price is known (an
    unknown price is not guessed; llm_routing.pricing)."""
    from . import pricing

    tokens = 0
    for attempt in routed.metadata.attempts:
        if attempt.outcome == "skipped":
            continue
        usage = routed.result.usage if attempt.served else attempt.usage
        if usage is not None:
            tokens += usage.input_tokens + usage.output_tokens
    cost = sum((c for c in pricing.costs(routed).attempts if c is not None), Decimal(0))
    return tokens, cost


def _on_request_routed(sender: Any, routed: RoutingResult | None = None, **kwargs: Any) -> None:
    """The routed request's usage (streams included), once, at the router's finish. On
    an event loop (the async router) the settlement is a task on that loop, which the
    router's announcement awaits; sent synchronously on a loop, nothing awaits a task, so
    a worker thread settles instead. Either way the receiver never waits on the cache."""
    grant = _current.get()
    if routed is None or grant is None or grant.released:
        forget()
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        settle(*_used(routed))
        forget()
        return
    grant.released = True
    _current.set(None)
    tokens, nano = _amounts(*_used(routed))
    if not deferring():
        # Sent synchronously on the loop (the async router's exit, torn down by a
        # cancellation or a failed announcement): a task could be cancelled with its
        # loop, losing the charge and holding the place in flight until its lease. A
        # worker thread of the loop's executor finishes whatever happens to the loop
        # (``asyncio.run`` waits for it).
        loop.run_in_executor(None, _settle_quietly, grant, tokens, nano)
        return
    task = loop.create_task(_asettle(grant, tokens, nano))
    _settling.add(task)
    task.add_done_callback(_settling.discard)
    defer(task)  # the async router's exit awaits it: never lost to a loop's end


def _settle_quietly(grant: Grant, tokens: int, nano: int) -> None:
    try:
        _settle_grant(grant, tokens, nano)
    except Exception:  # a soft-threshold receiver: logged, the charge is made
        logger.exception("Settling a request's budgets failed.")
    finally:
        close_old_connections()  # a worker thread: as _in_worker


def _on_request_finished(sender: Any, **kwargs: Any) -> None:
    forget()


def _connect() -> None:
    """Settle from ``request_routed`` (sent once per routed request when the router
    finishes, streams included); forget at the end of each HTTP request."""
    from django.core.signals import request_finished

    from .signals import request_routed

    request_routed.connect(_on_request_routed, dispatch_uid="llm_routing.budgets.settle")
    request_finished.connect(_on_request_finished, dispatch_uid="llm_routing.budgets.forget")
    post_save.connect(_rows_changed, sender=Budget, dispatch_uid="llm_routing.budgets.rows")
    post_delete.connect(_rows_changed, sender=Budget, dispatch_uid="llm_routing.budgets.rows")


_connect()


def usage(budgets: Iterable[Budget]) -> dict[str, Usage]:
    """Each budget's counters in its current window, by name (one cache read)."""
    budgets = list(budgets)
    now = clock()
    keys = _keys(budgets, [_start(b, now) for b in budgets])
    values = _cache().get_many(keys)
    out: dict[str, Usage] = {}
    for i, b in enumerate(budgets):
        r, t, c = (int(values.get(keys[3 * i + j]) or 0) for j in range(3))
        out[b.name] = Usage(requests=r, tokens=t, cost_usd=Decimal(c) / NANO)
    return out
