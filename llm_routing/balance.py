"""What the step strategies read of the world (:mod:`llm_routing.strategies` is pure):
requests in flight, recent latency, an estimated cost (docs/strategies.md).

* **In flight** (``least_in_flight``): one lease per call, held from just before the
  call until it returns (a stream's: until the request ends). With a Redis routing cache the leases
  are a sorted set per provider, shared by every worker and instance (a lease is
  scored by its expiry, so a crashed worker's leases expire after :func:`lease_s`);
  with any other cache, per process. The effects :class:`CountInFlight`,
  :class:`Lease` and :class:`Unlease` are quiet: should the cache fail, the step is
  ordered as if nothing were in flight.
* **Latency** (``latency``): a peak-EWMA per provider, per process — a slower sample
  counts at once, a faster one decays the score over :data:`DECAY_S`; a failed call
  counts at least :data:`FAILURE_PENALTY_MS`.
* **Affinity** (any strategy): the provider that last served a request's affinity key
  in a step, stored under the SHA-256 of (chain, step, key) — never the key — for the
  serving provider's ``affinity_ttl_s`` (:class:`Recall`, :class:`Remember`; quiet: on
  a cache failure the step's strategy picks).
* **Cost** (``cost``): this request's estimated tokens (input characters / 4, and the
  ``max_tokens`` asked for, else the row's, else :data:`DEFAULT_OUTPUT_TOKENS`) at
  the provider's prices (:mod:`llm_routing.pricing`: the row's override, else
  genai-prices).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from . import pricing
from .cache import acall, async_redis, raw_redis, routing_cache, run_script
from .conf import routing_settings
from .effects import Context, Effect
from .models import Provider
from .strategies import Candidate, Inputs
from .types import AuditRequest, Usage

__all__ = [
    "DECAY_S",
    "DEFAULT_OUTPUT_TOKENS",
    "FAILURE_PENALTY_MS",
    "CountInFlight",
    "Lease",
    "Recall",
    "Remember",
    "Unlease",
    "affinity_cache_key",
    "estimate_tokens",
    "estimate_usd",
    "gather",
    "latencies",
    "lease_s",
    "observe_answer",
    "observe_latency",
    "p95",
    "reset",
]

logger = logging.getLogger("llm_routing.balance")

#: The peak-EWMA's time constant (seconds): a faster sample weighs 1 - e^(-dt/DECAY_S).
DECAY_S = 10.0
#: A failed call counts as at least this slow (ms) for the latency strategy.
FAILURE_PENALTY_MS = 5000.0
#: The output tokens a cost estimate assumes when neither the request nor the row says.
DEFAULT_OUTPUT_TOKENS = 256
#: A lease outlives the request deadline by this much (seconds) before it expires.
LEASE_MARGIN_S = 60.0
_KEY = "llm_routing:inflight:{}"

#: The clock of leases and latency samples (wall time: leases are compared across
#: hosts); a fake clock in tests.
clock: Callable[[], float] = time.time


def lease_s() -> float:
    """How long a lease lives when nobody releases it (a crashed worker)."""
    return float(routing_settings.REQUEST_DEADLINE_S) + LEASE_MARGIN_S


# --- in flight -----------------------------------------------------------------------

# KEYS: the providers' sorted sets. ARGV[1]: now; ARGV[2]: "count" | "add" | "remove";
# ARGV[3]: the lease id; ARGV[4]: its expiry. Expired leases are dropped first.
_LEASE_SCRIPT = """
local now = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if ARGV[2] == 'add' then
    redis.call('ZADD', key, tonumber(ARGV[4]), ARGV[3])
    redis.call('PEXPIREAT', key, math.ceil(tonumber(ARGV[4]) * 1000))
  elseif ARGV[2] == 'remove' then
    redis.call('ZREM', key, ARGV[3])
  end
  out[i] = redis.call('ZCARD', key)
end
return out
"""


class _LocalLeases:
    """The per-process leases (any cache but Redis), with the same expiry."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leases: dict[str, dict[str, float]] = {}

    def run(self, names: Iterable[str], op: str, lease: str, expires: float) -> list[int]:
        now = clock()
        out: list[int] = []
        with self.lock:
            for name in names:
                held = self.leases.setdefault(name, {})
                for key in [k for k, until in held.items() if until <= now]:
                    del held[key]
                if op == "add":
                    held[lease] = expires
                elif op == "remove":
                    held.pop(lease, None)
                out.append(len(held))
        return out


_local = _LocalLeases()


def _keys(store: Any, names: Iterable[str]) -> list[str]:
    return [store.make_key(_KEY.format(n)) for n in names]


def _leases(names: tuple[str, ...], op: str, lease: str = "") -> list[int]:
    now = clock()
    expires = now + lease_s()
    store = routing_cache()
    client = raw_redis(store)
    if client is None:
        return _local.run(names, op, lease, expires)
    counts = run_script(client, _LEASE_SCRIPT, _keys(store, names), [now, op, lease, expires])
    return [int(c) for c in counts]


async def _aleases(names: tuple[str, ...], op: str, lease: str = "") -> list[int]:
    now = clock()
    expires = now + lease_s()
    store = routing_cache()
    aio = async_redis(store)
    if aio is None:
        return _local.run(names, op, lease, expires)
    counts = await aio.run_script(_LEASE_SCRIPT, _keys(store, names), [now, op, lease, expires])
    return [int(c) for c in counts]


@dataclass(frozen=True, slots=True)
class CountInFlight(Effect[dict[str, int]]):
    """The requests in flight per provider (live leases) → dict. Quiet: {} on failure."""

    names: tuple[str, ...]
    quiet: ClassVar[bool] = True

    def fallback(self) -> dict[str, int]:
        return {}

    def run(self, ctx: Context) -> dict[str, int]:
        return dict(zip(self.names, _leases(self.names, "count"), strict=True))

    async def arun(self, ctx: Context) -> dict[str, int]:
        return dict(zip(self.names, await _aleases(self.names, "count"), strict=True))


@dataclass(frozen=True, slots=True)
class Lease(Effect[str]):
    """Take a lease on a place in flight at ``name`` → the lease id ("" on failure)."""

    name: str
    quiet: ClassVar[bool] = True

    def fallback(self) -> str:
        return ""

    def run(self, ctx: Context) -> str:
        lease = uuid.uuid4().hex
        _leases((self.name,), "add", lease)
        return lease

    async def arun(self, ctx: Context) -> str:
        lease = uuid.uuid4().hex
        await _aleases((self.name,), "add", lease)
        return lease


@dataclass(frozen=True, slots=True)
class Unlease(Effect[None]):
    """Give a lease back → None (quiet: an unreturned lease expires on its own)."""

    name: str
    lease: str
    quiet: ClassVar[bool] = True

    def fallback(self) -> None:
        return None

    def run(self, ctx: Context) -> None:
        if self.lease:
            _leases((self.name,), "remove", self.lease)

    async def arun(self, ctx: Context) -> None:
        if self.lease:
            await _aleases((self.name,), "remove", self.lease)


# --- affinity --------------------------------------------------------------------------


def affinity_cache_key(chain: str, step: int, key: str) -> str:
    """The cache key of an affinity key in a chain's step: a hash, never the key."""
    digest = hashlib.sha256(f"{chain}\x00{step}\x00{key}".encode()).hexdigest()
    return f"llm_routing:affinity:{digest}"


@dataclass(frozen=True, slots=True)
class Recall(Effect[str | None]):
    """The provider that last served this affinity cache key → name or None (quiet)."""

    key: str
    quiet: ClassVar[bool] = True

    def fallback(self) -> str | None:
        return None

    def run(self, ctx: Context) -> str | None:
        value = routing_cache().get(self.key)
        return value if isinstance(value, str) else None

    async def arun(self, ctx: Context) -> str | None:
        value = await acall(routing_cache(), "get", self.key)
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Remember(Effect[None]):
    """Store ``name`` as the provider of this affinity cache key for ``ttl_s`` → None."""

    key: str
    name: str
    ttl_s: float
    quiet: ClassVar[bool] = True

    def fallback(self) -> None:
        return None

    def run(self, ctx: Context) -> None:
        routing_cache().set(self.key, self.name, self.ttl_s)

    async def arun(self, ctx: Context) -> None:
        await acall(routing_cache(), "set", self.key, self.name, self.ttl_s)


# --- latency ---------------------------------------------------------------------------

_latency: dict[str, tuple[float, float]] = {}  # provider → (peak-EWMA ms, sampled at)
_latency_lock = threading.Lock()


def observe_latency(name: str, latency_ms: float, *, ok: bool) -> None:
    """Feed one finished call into ``name``'s peak-EWMA."""
    sample = latency_ms if ok else max(latency_ms, FAILURE_PENALTY_MS)
    now = clock()
    with _latency_lock:
        old = _latency.get(name)
        if old is None or sample >= old[0]:
            value = sample  # the peak: a slower sample counts at once
        else:
            w = math.exp(-max(0.0, now - old[1]) / DECAY_S)
            value = old[0] * w + sample * (1 - w)
        _latency[name] = (value, now)


#: Hedging's ``p95``: the last :data:`P95_SAMPLES` successful latencies per provider,
#: per process; below :data:`P95_MIN_SAMPLES` of them there is no p95 (no hedge).
P95_SAMPLES = 64
P95_MIN_SAMPLES = 20
_recent: dict[str, deque[float]] = {}


def observe_answer(name: str, latency_ms: float) -> None:
    """Feed one successful call's latency into ``name``'s ring (for :func:`p95`)."""
    with _latency_lock:
        ring = _recent.get(name)
        if ring is None:
            ring = _recent[name] = deque(maxlen=P95_SAMPLES)
        ring.append(latency_ms)


def p95(name: str) -> float | None:
    """The 95th percentile (nearest rank) of ``name``'s recent successful latencies in
    this process, in ms; None with fewer than :data:`P95_MIN_SAMPLES`."""
    with _latency_lock:
        samples = sorted(_recent.get(name, ()))
    if len(samples) < P95_MIN_SAMPLES:
        return None
    return samples[max(0, math.ceil(0.95 * len(samples)) - 1)]


def latencies(names: Iterable[str]) -> dict[str, float | None]:
    """The current peak-EWMA per provider (None: no sample in this process yet)."""
    return {n: (v[0] if (v := _latency.get(n)) is not None else None) for n in names}


# --- cost ------------------------------------------------------------------------------


def _output_tokens(request: AuditRequest, row: Provider | None) -> int:
    if request.max_tokens is not None:
        return int(request.max_tokens)
    for key in ("max_tokens", "max_completion_tokens"):
        value = (row.params or {}).get(key) if row is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_OUTPUT_TOKENS


def _usage(request: AuditRequest, row: Provider | None) -> Usage:
    return Usage(
        input_tokens=max(1, math.ceil(request.input_length / 4)),
        output_tokens=_output_tokens(request, row),
    )


def estimate_tokens(row: Provider | None, request: AuditRequest) -> int:
    """This request's estimated tokens on ``row``, input and output (as for its cost;
    without a row, :data:`DEFAULT_OUTPUT_TOKENS` unless the request says)."""
    usage = _usage(request, row)
    return usage.input_tokens + usage.output_tokens


def estimate_usd(row: Provider | None, model: str, request: AuditRequest) -> float | None:
    """This request's estimated cost on ``row`` (None: the price is unknown)."""
    source = pricing.source_of(row, "") if row is not None else None
    if row is None or source is None:
        return None
    usage = _usage(request, row)
    try:
        cost = pricing.price(source, model or row.model, usage)
    except Exception:  # the price package failing must not fail routing: unknown
        logger.warning("Could not estimate the cost on provider %s.", row.name, exc_info=True)
        return None
    return None if cost is None else float(cost)


def gather(
    strategy: str,
    members: Iterable[Candidate],
    request: AuditRequest,
    rows: dict[str, Provider],
    counts: dict[str, int] | None = None,
) -> Inputs:
    """The :class:`~llm_routing.strategies.Inputs` a strategy reads, except the counts in
    flight (I/O: the :class:`CountInFlight` effect, passed in as ``counts``)."""
    members = list(members)
    if strategy == "latency":
        return Inputs(latencies=latencies(c.name for c in members))
    if strategy == "cost":
        return Inputs(
            costs={c.name: estimate_usd(rows.get(c.name), c.model, request) for c in members}
        )
    return Inputs(counts=counts or {})


def reset() -> None:
    """Forget this process's latencies and local leases. For tests."""
    with _latency_lock:
        _latency.clear()
        _recent.clear()
    with _local.lock:
        _local.leases.clear()
