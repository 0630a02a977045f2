"""Circuit breakers and passive health per (provider, model) (docs/circuit-breakers.md).

Two layers, after pybreaker / purgatory:

* **Pure state machine** — :class:`Circuit` (a frozen value), :func:`on_success`,
  :func:`on_failure` and :meth:`Circuit.phase`. No I/O; the time ``now`` is passed in,
  so every transition is tested on a fake clock.
* **Store** — :class:`CircuitStore` keeps one :class:`Circuit` per (provider, model) in
  the Django cache alias ``LLM_ROUTING["CACHE_ALIAS"]``: per-process LocMem by default,
  shared by every worker process when that alias is Redis.

States: ``closed`` → (``BREAKER_FAILURE_THRESHOLD`` consecutive transient failures, or
one 429 whose Retry-After exceeds ``RETRY_AFTER_CAP_S``) → ``open`` for the next step of
the ``BREAKER_COOLDOWNS_S`` ladder (capped at ``BREAKER_COOLDOWN_MAX_S``) → ``half_open``
once the cooldown has passed: exactly one probe request goes through, across all
processes, guarded by an atomic ``cache.add`` with a TTL and a second read of the
circuit once the slot is taken (a claim made on a "half-open" read that a just-finished
probe has made stale is given back); everyone else skips the candidate as
``circuit_open``. The probe's success closes the circuit, its failure
re-opens it with the next ladder step. ``BREAKER_RESET_AFTER_S`` without a counted
failure ends the streak (ladder back to the first step). Only transient failures count
(the failure policy table): client errors never open a circuit and ``context_length`` never
counts.

Hand-written on purpose: pybreaker keeps state per process (its Redis
storage has no single-probe half-open across processes) and purgatory is asyncio-only;
neither stores in the Django cache nor knows the router's failure taxonomy.

A cache that errors or is unreachable never breaks routing: the store falls back to
process-local state, logs that once, and tries the cache again after
:data:`CACHE_RETRY_S`. Counts are read-modify-write and therefore best effort under
concurrency; the single-probe guarantee rests on the atomic add, that second read, and
no write from a non-probe failure while half-open (it could restore an expired record
over the probe's re-opening).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from django.core.exceptions import ImproperlyConfigured

from .. import effects
from ..cache import CACHE_RETRY_S as _CACHE_RETRY_S
from ..cache import CacheBackoff, acall, routing_cache
from ..conf import routing_settings
from ..effects import ClientGone, Context, Effect, Steps
from ..types import ErrorInfo, ProviderConfig, ProviderResult

if TYPE_CHECKING:
    from ..models import Provider

__all__ = [
    "CACHE_RETRY_S",
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "RECORD_TTL_S",
    "SUCCESS_WRITE_INTERVAL_S",
    "Allow",
    "CacheOp",
    "Circuit",
    "CircuitStore",
    "Observe",
    "Peek",
    "PeekCircuit",
    "Policy",
    "aallow",
    "allow",
    "aobserve",
    "apeek",
    "counts",
    "is_probe",
    "observe",
    "on_failure",
    "on_success",
    "peek",
    "store",
]

logger = logging.getLogger("llm_routing.breaker")

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

#: After a cache error, the store uses process-local state for this long before it
#: tries the shared cache again (so a dead Redis costs one failed call per interval).
CACHE_RETRY_S = _CACHE_RETRY_S
#: Circuit records expire from the cache after this long without a real call.
RECORD_TTL_S = 86_400
#: A success on a clean, closed circuit rewrites ``last_success_at`` at most this often
#: (the hot path of a healthy provider then costs one cache read per call).
SUCCESS_WRITE_INTERVAL_S = 1.0

Clock = Callable[[], float]
T = TypeVar("T")
#: What a cache operation answers.
R = TypeVar("R", covariant=True)


# --- pure state machine ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Policy:
    """The breaker settings, validated (read from ``LLM_ROUTING`` per call)."""

    threshold: int = 3
    cooldowns: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)
    cooldown_max: float = 10.0
    reset_after: float = 60.0
    retry_after_cap: float = 5.0
    retry_after_max: float = 300.0
    probe_ttl: float = 10.0

    @classmethod
    def from_settings(cls) -> Policy:
        s = routing_settings
        try:
            ladder = tuple(float(v) for v in s.BREAKER_COOLDOWNS_S)
            policy = cls(
                threshold=int(s.BREAKER_FAILURE_THRESHOLD),
                cooldowns=ladder,
                cooldown_max=float(s.BREAKER_COOLDOWN_MAX_S),
                reset_after=float(s.BREAKER_RESET_AFTER_S),
                retry_after_cap=float(s.RETRY_AFTER_CAP_S),
                retry_after_max=float(s.BREAKER_RETRY_AFTER_MAX_S),
                probe_ttl=float(s.BREAKER_PROBE_TTL_S),
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"LLM_ROUTING breaker settings are invalid: {exc}") from exc
        if policy.threshold < 1 or not ladder or min(ladder) <= 0 or policy.cooldown_max <= 0:
            raise ImproperlyConfigured(
                "LLM_ROUTING: BREAKER_FAILURE_THRESHOLD must be >= 1 and BREAKER_COOLDOWNS_S "
                "a non-empty list of positive seconds (BREAKER_COOLDOWN_MAX_S positive)."
            )
        return policy

    def cooldown(self, level: int) -> float:
        """Seconds the ``level``-th opening of a streak (0-based) stays open."""
        return min(self.cooldowns[min(level, len(self.cooldowns) - 1)], self.cooldown_max)


@dataclass(frozen=True, slots=True)
class Circuit:
    """The breaker state and passive health of one (provider, model). Times are epoch
    seconds (wall clock, comparable across processes and hosts)."""

    provider: str
    model: str
    state: str = CLOSED  # stored state: closed | open (half-open is derived: phase())
    failures: int = 0  # consecutive counted failures
    level: int = 0  # openings in the current streak (index into the cooldown ladder)
    opened_at: float | None = None
    open_until: float | None = None
    last_failure_at: float | None = None  # last counted (transient) failure
    last_success_at: float | None = None
    last_error_at: float | None = None
    last_error_category: str | None = None
    last_http_status: int | None = None

    def phase(self, now: float) -> str:
        if self.state != OPEN:
            return CLOSED
        if self.open_until is not None and now >= self.open_until:
            return HALF_OPEN
        return OPEN

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, provider: str, model: str, record: Any) -> Circuit:
        """A circuit from a cache record; anything unreadable is a fresh closed one."""
        if not isinstance(record, Mapping):
            return cls(provider=provider, model=model)
        names = {f.name for f in fields(cls)} - {"provider", "model"}
        try:
            circuit = cls(
                provider=provider, model=model, **{k: v for k, v in record.items() if k in names}
            )
        except TypeError:
            return cls(provider=provider, model=model)
        if circuit.state not in (CLOSED, OPEN) or not _well_typed(circuit):
            return cls(provider=provider, model=model)
        return circuit

    def health(self, now: float) -> dict[str, Any]:
        """The passive-health view served by ``GET /health/`` (JSON-safe)."""
        phase = self.phase(now)
        return {
            "state": phase,
            "consecutive_failures": self.failures,
            "cooldown_step": self.level,
            "open_until": _iso(self.open_until) if phase != CLOSED else None,
            "last_success_at": _iso(self.last_success_at),
            "last_error_at": _iso(self.last_error_at),
            "last_error_category": self.last_error_category,
            "last_http_status": self.last_http_status,
        }


@dataclass(frozen=True, slots=True)
class Peek:
    """A read-only look at one circuit (:meth:`CircuitStore.peek`)."""

    tracked: bool  # False for the mock: no upstream, no circuit
    phase: str  # closed | open | half_open
    allowed: bool  # what allow() would answer now
    probe: bool  # the call would be the half-open probe (the slot is free)
    circuit: Circuit | None


_NUMBER = (int, float)
_TYPES: dict[str, tuple[type, ...]] = {
    "failures": (int,),
    "level": (int,),
    "opened_at": (*_NUMBER, type(None)),
    "open_until": (*_NUMBER, type(None)),
    "last_failure_at": (*_NUMBER, type(None)),
    "last_success_at": (*_NUMBER, type(None)),
    "last_error_at": (*_NUMBER, type(None)),
    "last_error_category": (str, type(None)),
    "last_http_status": (int, type(None)),
}


def _well_typed(circuit: Circuit) -> bool:
    """A record read from a shared cache is checked before the router relies on it."""
    if circuit.state == OPEN and not isinstance(circuit.open_until, _NUMBER):
        return False
    return all(
        isinstance(getattr(circuit, name), types) and not isinstance(getattr(circuit, name), bool)
        for name, types in _TYPES.items()
    )


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")


def counts(error: ErrorInfo) -> bool:
    """Whether a failure counts toward opening the circuit: the policy the error
    carries (:class:`~llm_routing.types.ErrorInfo`), read, never re-derived here."""
    return bool(error.counts)


def _quiet(circuit: Circuit, now: float, policy: Policy) -> bool:
    last = circuit.last_failure_at
    return last is None or now - last >= policy.reset_after


def _open(circuit: Circuit, now: float, policy: Policy, error: ErrorInfo) -> Circuit:
    cooldown = policy.cooldown(circuit.level)
    if _long_429(error, policy):
        cooldown = max(cooldown, min(float(error.retry_after_s or 0), policy.retry_after_max))
    return replace(
        circuit, state=OPEN, opened_at=now, open_until=now + cooldown, level=circuit.level + 1
    )


def _long_429(error: ErrorInfo, policy: Policy) -> bool:
    return (
        error.category == "rate_limit"
        and error.retry_after_s is not None
        and error.retry_after_s > policy.retry_after_cap
    )


def on_success(circuit: Circuit, now: float, policy: Policy) -> Circuit:
    """The provider answered: close (from any phase); the ladder is kept until the
    quiet window has passed, so a flapping provider climbs it."""
    return replace(
        circuit,
        state=CLOSED,
        failures=0,
        level=0 if _quiet(circuit, now, policy) else circuit.level,
        opened_at=None,
        open_until=None,
        last_success_at=now,
    )


def on_failure(
    circuit: Circuit, now: float, policy: Policy, error: ErrorInfo, *, probe: bool = False
) -> Circuit:
    """One failed call (after retries). ``probe`` marks the half-open probe's result."""
    seen = replace(
        circuit,
        last_error_at=now,
        last_error_category=error.category,
        last_http_status=error.http_status,
    )
    phase = circuit.phase(now)
    if not counts(error):
        # The provider answered (4xx, policy, bad body): never opens, and a probe that
        # got such an answer proves the route is alive.
        if phase == HALF_OPEN and probe:
            return replace(seen, state=CLOSED, failures=0, opened_at=None, open_until=None)
        return seen
    if phase == CLOSED:
        failures, level = circuit.failures, circuit.level
        if _quiet(circuit, now, policy):
            failures, level = 0, 0
        seen = replace(seen, failures=failures + 1, level=level, last_failure_at=now)
        if seen.failures >= policy.threshold or _long_429(error, policy):
            return _open(seen, now, policy, error)
        return seen
    seen = replace(seen, failures=circuit.failures + 1, last_failure_at=now)
    if phase == HALF_OPEN and probe:
        return _open(seen, now, policy, error)
    # A call that started before the circuit opened (or a stray one in half-open):
    # health only — but a long Retry-After still extends the open period.
    if _long_429(error, policy) and phase == OPEN:
        until = now + min(float(error.retry_after_s or 0), policy.retry_after_max)
        return replace(seen, open_until=max(circuit.open_until or now, until))
    return seen


def _fresh_success(circuit: Circuit, now: float) -> bool:
    """A clean, closed circuit whose last success was written moments ago: another
    success changes nothing worth a write (:data:`SUCCESS_WRITE_INTERVAL_S`)."""
    return (
        circuit.state == CLOSED
        and circuit.failures == 0
        and circuit.level == 0
        and circuit.last_success_at is not None
        and 0 <= now - circuit.last_success_at < SUCCESS_WRITE_INTERVAL_S
    )


# --- storage -------------------------------------------------------------------------------


class _LocalCache:
    """Process-local stand-in for the cache (used only while the cache is failing)."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[Any, float]] = {}
        self._lock = threading.Lock()

    def _live(self, key: str, now: float) -> bool:
        item = self._data.get(key)
        if item is None:
            return False
        if item[1] <= now:
            del self._data[key]
            return False
        return True

    def get(self, key: str) -> Any:
        with self._lock:
            return self._data[key][0] if self._live(key, time.monotonic()) else None

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        out = {}
        for key in keys:
            value = self.get(key)
            if value is not None:
                out[key] = value
        return out

    def set(self, key: str, value: Any, timeout: int) -> None:
        with self._lock:
            self._data[key] = (value, time.monotonic() + timeout)

    def add(self, key: str, value: Any, timeout: int) -> bool:
        with self._lock:
            now = time.monotonic()
            if self._live(key, now):
                return False
            self._data[key] = (value, now + timeout)
            return True

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)


#: Probe slots this context holds: circuit key -> the slot's token.
_probing: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "llm_routing_breaker_probing", default=MappingProxyType({})
)


#: Circuits this context found closed in :meth:`CircuitStore.allow`: circuit key -> the
#: circuit as read. A success observed on a circuit that was clean then needs no read.
_seen: contextvars.ContextVar[Mapping[str, Circuit]] = contextvars.ContextVar(
    "llm_routing_breaker_seen", default=MappingProxyType({})
)


def _remember(key: str, circuit: Circuit | None) -> None:
    seen = {k: v for k, v in _seen.get().items() if k != key}
    if circuit is not None:
        seen[key] = circuit
    _seen.set(seen)


def _holding(key: str, token: str | None) -> None:
    held = {k: v for k, v in _probing.get().items() if k != key}
    if token is not None:
        held[key] = token
    _probing.set(held)


def _key(provider: str, model: str) -> str:
    # Model names may hold characters some cache backends refuse in keys.
    digest = hashlib.sha256(model.encode("utf-8")).hexdigest()[:16]
    return f"llm_routing:circuit:{provider}:{digest}"


def _names(config: ProviderConfig) -> tuple[str, str]:
    return config.name, config.model


def _tracked(config: ProviderConfig) -> bool:
    """The mock (kind or mode) has no upstream and no circuit."""
    return config.kind != "mock" and config.mode != "mock"


@dataclass(frozen=True, slots=True)
class CacheOp(Effect[R]):
    """One call on the circuit cache (``method(*args)``) → the cache's answer; raises
    what the cache raised. Blocking: the routing cache's method. Awaited: LocMem
    (process memory) inline, Redis through ``redis.asyncio`` on this loop (Django's own
    async Redis methods are sync_to_async wrappers that queue every call on one
    thread), any other backend through its async method (``aget``, ``aadd``, ...).
    Built by :func:`_get`, :func:`_get_many`, :func:`_set`, :func:`_add` and
    :func:`_delete`, which type the answer; :meth:`CircuitStore._cache` performs it."""

    method: str
    args: tuple[object, ...]

    def on(self, cache: Any) -> R:
        """The same call on another cache (the process-local stand-in)."""
        result: R = getattr(cache, self.method)(*self.args)
        return result

    def run(self, ctx: Context) -> R:
        return self.on(routing_cache())  # one client per process (llm_routing.cache)

    async def arun(self, ctx: Context) -> R:
        result: R = await acall(routing_cache(), self.method, *self.args)
        return result


def _get(key: str) -> CacheOp[object]:
    return CacheOp("get", (key,))


def _get_many(keys: list[str]) -> CacheOp[dict[str, object]]:
    return CacheOp("get_many", (keys,))


def _set(key: str, record: dict[str, Any]) -> CacheOp[None]:
    return CacheOp("set", (key, record, RECORD_TTL_S))


def _add(key: str, token: str, ttl: int) -> CacheOp[bool]:
    return CacheOp("add", (key, token, ttl))


def _delete(key: str) -> CacheOp[object]:
    return CacheOp("delete", (key,))


class CircuitStore:
    """Circuits in the Django cache, with a process-local fallback."""

    def __init__(self, *, clock: Clock = time.time) -> None:
        self.clock = clock
        self._local = _LocalCache()
        #: The cache-down back-off (:class:`llm_routing.cache.CacheBackoff`); the module's
        #: ``time.monotonic`` at call time (a fake one in tests).
        self.backoff = CacheBackoff(CACHE_RETRY_S, clock=lambda: time.monotonic())

    # -- cache access that never raises ---------------------------------------------
    def _cache(self, op: CacheOp[T]) -> Steps[T]:
        """``op`` on the shared cache while it answers, else on process-local state (the
        failure logged once, the cache tried again after :data:`CACHE_RETRY_S`). Written
        once for both trampolines: :class:`CacheOp` knows its blocking and awaited call."""
        if self.backoff.open():
            try:
                result = yield from op
            except Exception as exc:
                self._cache_failed(exc)
            else:
                self._cache_answered()
                return result
        return op.on(self._local)

    def _cache_answered(self) -> None:
        if self.backoff.answered():
            logger.warning("Circuit cache is reachable again; using shared state.")

    def _cache_failed(self, exc: Exception) -> None:
        if self.backoff.failed():
            # The exception's text may name the cache location: log its type only.
            logger.warning(
                "Circuit cache %r failed (%s); using process-local circuit state until it "
                "answers again.",
                routing_settings.CACHE_ALIAS,
                type(exc).__name__,
            )

    @property
    def degraded(self) -> bool:
        """True while the store runs on process-local state."""
        return self.backoff.down

    # -- records ------------------------------------------------------------------------
    def _call(self, op: CacheOp[T]) -> T:
        """One cache operation, blocking (the store's own reads and writes)."""
        return effects.run(self._cache(op))

    def load(self, provider: str, model: str) -> Circuit:
        return Circuit.from_record(provider, model, self._call(_get(_key(provider, model))))

    def load_many(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Circuit]:
        pairs = list(dict.fromkeys(pairs))
        keys = {_key(p, m): (p, m) for p, m in pairs}
        found = self._call(_get_many(list(keys))) or {}
        return {
            pair: Circuit.from_record(pair[0], pair[1], found.get(key))
            for key, pair in keys.items()
        }

    def save(self, circuit: Circuit) -> None:
        self._call(_set(_key(circuit.provider, circuit.model), circuit.to_record()))

    def reset(self, provider: str, model: str) -> None:
        """Close the circuit and forget its health (admin action, management command)."""
        key = _key(provider, model)
        self._call(_delete(key))
        self._call(_delete(key + ":probe"))
        logger.warning("Circuit %s/%s reset by an operator.", provider, model)

    def force_open(self, provider: str, model: str, seconds: float) -> Circuit:
        """Open the circuit for ``seconds`` from now (admin breaker board): the router
        skips it (``circuit_open``) until then, then one probe decides. The failure
        streak and cooldown step are kept."""
        now = self.clock()
        before = self.load(provider, model)
        after = replace(before, state=OPEN, opened_at=now, open_until=now + float(seconds))
        self.save(after)
        logger.warning(
            "Circuit %s/%s forced open for %.0fs by an operator.", provider, model, seconds
        )
        return after

    # -- the router's two calls -------------------------------------------------------------
    # Each decision is written once, as a core of :class:`CacheOp` effects (through
    # :meth:`_cache`); the sync trampoline (``effects.run``) runs it with blocking cache
    # calls, the async one (``effects.arun``) with awaited ones (LocMem inline). A
    # cancellation there lets the decision clean up (a probe slot it took is freed).
    def allow(self, config: ProviderConfig) -> bool:
        """Whether a call to this (provider, model) may start now. In half-open it
        claims the single probe slot; only the claimant gets True."""
        return effects.run(self._allow(config))

    async def aallow(self, config: ProviderConfig) -> bool:
        """:meth:`allow` through the async cache path (one ``get`` when closed)."""
        return await effects.arun(self._allow(config))

    def _allow(self, config: ProviderConfig) -> Steps[bool]:
        if not _tracked(config):
            return True
        now = self.clock()
        key = _key(config.name, config.model)
        circuit = Circuit.from_record(
            config.name, config.model, (yield from self._cache(_get(key)))
        )
        phase = circuit.phase(now)
        if key in _probing.get():  # a claim left over by a call that never reported
            _holding(key, None)
        if phase == CLOSED:
            _remember(key, circuit)
            return True
        if phase == OPEN:
            return False
        ttl = max(Policy.from_settings().probe_ttl, float(config.timeout_s) + 1.0)
        token = uuid.uuid4().hex
        if not (yield from self._cache(_add(key + ":probe", token, math.ceil(ttl)))):
            return False
        # The slot may be free because a probe has just finished: it wrote the circuit,
        # then freed the slot, after this call read "half-open". Read again, so a failed
        # probe's re-opening is not followed by a second probe in the same moment.
        try:
            record = yield from self._cache(_get(key))
        except ClientGone:  # cancelled before the claim is this context's: give it back
            yield from self._cache(_delete(key + ":probe"))
            raise
        latest = Circuit.from_record(config.name, config.model, record)
        phase = latest.phase(self.clock())
        if phase != HALF_OPEN:
            yield from self._cache(_delete(key + ":probe"))  # the slot this call just took
            if phase == CLOSED:  # the probe succeeded: a plain call
                _remember(key, latest)
                return True
            return False
        _holding(key, token)
        logger.info("Circuit %s/%s half-open: this call is the probe.", config.name, config.model)
        return True

    def is_probe(self, config: ProviderConfig) -> bool:
        return _key(config.name, config.model) in _probing.get()

    def peek(self, config: ProviderConfig) -> Peek:
        """What :meth:`allow` would answer now, read-only: no probe slot is claimed, no
        record written, no claim of this context touched (explain-route, the admin)."""
        return effects.run(self._peek(config))

    async def apeek(self, config: ProviderConfig) -> Peek:
        """:meth:`peek` through the async cache path."""
        return await effects.arun(self._peek(config))

    def _peek(self, config: ProviderConfig) -> Steps[Peek]:
        if not _tracked(config):
            return Peek(tracked=False, phase=CLOSED, allowed=True, probe=False, circuit=None)
        key = _key(config.name, config.model)
        circuit = Circuit.from_record(
            config.name, config.model, (yield from self._cache(_get(key)))
        )
        phase = circuit.phase(self.clock())
        if phase == CLOSED:
            return Peek(tracked=True, phase=phase, allowed=True, probe=False, circuit=circuit)
        if phase == OPEN:
            return Peek(tracked=True, phase=phase, allowed=False, probe=False, circuit=circuit)
        free = (yield from self._cache(_get(key + ":probe"))) is None
        return Peek(tracked=True, phase=phase, allowed=free, probe=free, circuit=circuit)

    def observe(self, config: ProviderConfig, result: ProviderResult) -> None:
        """Feed one finished call (after retries) into the circuit and its health."""
        effects.run(self._observe_all(config, result))

    async def aobserve(self, config: ProviderConfig, result: ProviderResult) -> None:
        """:meth:`observe` through the async cache path. Cancelled midway, it still frees
        the probe slot this call held (the async trampoline runs the cleanup)."""
        await effects.arun(self._observe_all(config, result))

    def _observe_all(self, config: ProviderConfig, result: ProviderResult) -> Steps[None]:
        if not _tracked(config):
            return
        key = _key(config.name, config.model)
        token = _probing.get().get(key)
        probe = token is not None
        if probe:
            _holding(key, None)
        try:
            if result.upstream_requests == 0 and not result.ok:
                return  # the budget ran out before any request: nothing was observed
            if result.error is not None and not result.error.observed:
                return  # the deadline or the client ended the call, not the provider
            yield from self._observe(config, result, probe=probe)
        finally:
            # Free the slot, unless it expired and another caller holds a new one.
            if probe and (yield from self._cache(_get(key + ":probe"))) == token:
                yield from self._cache(_delete(key + ":probe"))

    def _observe(
        self, config: ProviderConfig, result: ProviderResult, *, probe: bool
    ) -> Steps[None]:
        policy = Policy.from_settings()
        now = self.clock()
        key = _key(config.name, config.model)
        seen = _seen.get().get(key)
        if seen is not None:
            _remember(key, None)
            if result.ok and _fresh_success(seen, now):
                return  # the hot path: one cache read per call (allow's)
        before = Circuit.from_record(config.name, config.model, (yield from self._cache(_get(key))))
        if result.ok:
            if _fresh_success(before, now):
                return
            after = on_success(before, now, policy)
        else:
            error = result.error or ErrorInfo(category="response", message="")
            if not probe and before.phase(now) == HALF_OPEN:
                # A call admitted before the circuit opened, failing while the probe
                # decides: its update is health only, and writing it back could undo
                # the probe's re-opening written in between (read-modify-write).
                return
            after = on_failure(before, now, policy, error, probe=probe)
        yield from self._cache(_set(key, after.to_record()))
        was, now_phase = before.phase(now), after.phase(now)
        if now_phase == OPEN and (was != OPEN or after.opened_at != before.opened_at):
            logger.warning(
                "Circuit %s/%s opened for %.1fs after %s (step %d).",
                config.name,
                config.model,
                (after.open_until or now) - now,
                after.last_error_category,
                after.level,
            )
        elif now_phase == CLOSED and was != CLOSED:
            logger.warning("Circuit %s/%s closed: the provider answered.", *_names(config))

    def for_providers(self, providers: Iterable[Provider]) -> dict[str, list[Circuit]]:
        """Every circuit of these provider rows: the row's model first, then each model
        a chain entry overrides it with (one cache round trip)."""
        from ..models import ChainEntry

        rows = list(providers)
        models: dict[str, list[str]] = {p.name: [p.model] for p in rows}
        overrides = (
            ChainEntry.objects.filter(provider__in=rows)
            .exclude(model="")
            .values_list("provider__name", "model")
            .order_by("provider__name", "model")
        )
        for name, model in overrides:
            if model not in models[name]:
                models[name].append(model)
        loaded = self.load_many((name, m) for name, ms in models.items() for m in ms)
        return {name: [loaded[(name, m)] for m in ms] for name, ms in models.items()}

    def reset_provider(self, provider: Provider) -> int:
        """Reset every circuit of one provider row; returns how many were reset."""
        circuits = self.for_providers([provider])[provider.name]
        for circuit in circuits:
            self.reset(circuit.provider, circuit.model)
        return len(circuits)


#: The process-wide store the router uses. Tests may set ``store.clock``.
store = CircuitStore()


def allow(config: ProviderConfig) -> bool:
    """Whether a call to this (provider, model) may start now (see :class:`CircuitStore`)."""
    return store.allow(config)


def peek(config: ProviderConfig) -> Peek:
    """What :func:`allow` would answer now, without claiming or writing anything."""
    return store.peek(config)


def is_probe(config: ProviderConfig) -> bool:
    """Whether the current call to this (provider, model) is the half-open probe."""
    return store.is_probe(config)


def observe(config: ProviderConfig, result: ProviderResult) -> None:
    """Feed one finished call (after retries) into the breaker."""
    store.observe(config, result)


async def aallow(config: ProviderConfig) -> bool:
    """:func:`allow` on the async cache path (the probe claim is per task)."""
    return await store.aallow(config)


async def apeek(config: ProviderConfig) -> Peek:
    """:func:`peek` on the async cache path."""
    return await store.apeek(config)


async def aobserve(config: ProviderConfig, result: ProviderResult) -> None:
    """:func:`observe` on the async cache path."""
    await store.aobserve(config, result)


# --- the routing core's effects (llm_routing.effects) ------------------------------------


@dataclass(frozen=True, slots=True)
class Allow(Effect[bool]):
    """:func:`allow` for this config → bool (may claim the half-open probe slot).
    Quiet: should it fail, the call is let through (as on a cache outage)."""

    config: ProviderConfig
    quiet: ClassVar[bool] = True

    def fallback(self) -> bool:
        return True

    def run(self, ctx: Context) -> bool:
        return allow(self.config)

    async def arun(self, ctx: Context) -> bool:
        return await aallow(self.config)


@dataclass(frozen=True, slots=True)
class PeekCircuit(Effect[bool]):
    """:func:`peek` for this config → whether a call would be let through now (reads
    only: no probe slot claimed; explain). Quiet, like :class:`Allow`."""

    config: ProviderConfig
    quiet: ClassVar[bool] = True

    def fallback(self) -> bool:
        return True

    def run(self, ctx: Context) -> bool:
        return peek(self.config).allowed

    async def arun(self, ctx: Context) -> bool:
        return (await apeek(self.config)).allowed


@dataclass(frozen=True, slots=True)
class Observe(Effect[None]):
    """:func:`observe` this finished call → None (frees a probe slot it held). Quiet:
    the breaker's bookkeeping never changes the request's outcome."""

    config: ProviderConfig
    result: ProviderResult
    quiet: ClassVar[bool] = True

    def fallback(self) -> None:
        return None

    def run(self, ctx: Context) -> None:
        observe(self.config, self.result)

    async def arun(self, ctx: Context) -> None:
        await aobserve(self.config, self.result)
