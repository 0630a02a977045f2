"""The routing configuration as an immutable in-process snapshot (issue 14, item 3).

Providers, chains (with their ordered entries and who may use them) and the enabled
routing rules are read once into a :class:`ConfigSnapshot`; a routed request reads no
configuration row. API::

    from llm_routing import snapshot
    config = snapshot.current()          # sync
    config = await snapshot.acurrent()   # async: a rebuild runs in a worker thread

On an event loop, :func:`current` answers with the last snapshot built and does no I/O
(no version read, no rebuild): async code calls :func:`acurrent` first, at the start of
its request, and the sync code it then runs on the loop (validation, the access check)
reads that one. Were it to check and rebuild there, a snapshot expiring between the two
calls would read the database on the loop (``SynchronousOnlyOperation``: a 500). Where
the process allows queries on its loop (``DJANGO_ALLOW_ASYNC_UNSAFE``: a notebook, whose
cells run on a loop) it checks and rebuilds as anywhere else
(:func:`llm_routing.dbconn.queries_refused_here`).

Invalidation (docs/production.md, "Caches and their staleness"):

* Every change bumps a version key in the routing cache (``LLM_ROUTING["CACHE_ALIAS"]``):
  ``post_save`` / ``post_delete`` of Provider, Chain, ChainEntry and RoutingRule,
  ``m2m_changed`` of a chain's ``allowed_users`` / ``allowed_groups``, and the config
  models' bulk ``QuerySet.update`` / ``bulk_create`` / ``bulk_update`` (their
  :class:`~llm_routing.models.ConfigQuerySet` sends ``config_changed``);
  ``llm_routing_apply`` and the admin go through those. The key is bumped when the
  transaction commits, never before (a worker must not rebuild from rows that are not
  committed yet).
* The process that made the change rebuilds on its next read (a local generation
  counter, bumped at once), even inside the transaction.
* Every other process compares the version key at most every :data:`CHECK_INTERVAL_S`
  (0.5 s), so a change is live on every worker within 1 s (the interval plus one
  rebuild).
* When the cache fails, the snapshot is rebuilt from the database at most every
  :data:`FALLBACK_TTL_S` (1 s) instead, and the cache is tried again after
  :data:`CACHE_RETRY_S`; the bound stays 1 s.

Provider rows in the snapshot are :class:`~llm_routing.models.Provider` instances, read
only; ``key_present`` still reads the environment at call time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.db import router as db_router
from django.db.models.signals import m2m_changed, post_delete, post_save

from .cache import CACHE_RETRY_S as _CACHE_RETRY_S
from .cache import CacheBackoff, routing_cache
from .dbconn import queries_refused_here
from .models import Chain, ChainEntry, Provider, RoutingRule, group_steps, rule_matches
from .signals import config_changed
from .types import Principal

__all__ = [
    "CACHE_RETRY_S",
    "CHECK_INTERVAL_S",
    "FALLBACK_TTL_S",
    "MAX_AGE_S",
    "VERSION_KEY",
    "ChainSpec",
    "ConfigSnapshot",
    "EntrySpec",
    "RuleSpec",
    "acurrent",
    "build",
    "changed",
    "checked",
    "clear",
    "current",
    "unknown_chain",
]

#: A process compares the shared version key at most this often.
CHECK_INTERVAL_S = 0.5
#: With the cache failing, the snapshot is rebuilt at most this often.
FALLBACK_TTL_S = 1.0
#: After a cache failure, the version key is not read again for this long.
CACHE_RETRY_S = _CACHE_RETRY_S
#: Whatever the version key says, a snapshot is rebuilt after this long (a safety net
#: for a missed bump: a change rolled back after its own process read it, a bump lost
#: while the cache was restarting).
MAX_AGE_S = 60.0
#: The version key in the routing cache (under the alias's own KEY_PREFIX).
VERSION_KEY = "llm_routing:config_version"


@dataclass(frozen=True, slots=True)
class EntrySpec:
    """One chain entry: a provider at a position, with an optional model override."""

    provider: str
    position: int
    model: str = ""
    enabled: bool = True
    step: int | None = None  # entries sharing a step number form one step
    weight: float = 1.0
    strategy: str = ""


def _steps(entries: Iterable[EntrySpec]) -> tuple[tuple[str, tuple[EntrySpec, ...]], ...]:
    out: list[tuple[str, tuple[EntrySpec, ...]]] = []
    for group in group_steps(entries):
        live = tuple(e for e in group if e.enabled)
        if live:
            out.append(((group[0].strategy or "weighted") if len(group) > 1 else "", live))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ChainSpec:
    """A chain as the router and the access rules read it."""

    name: str
    is_default: bool = False
    stream_mode: str = "direct"
    mock_backstop: bool = False
    affinity_from_user: bool = False
    hedge_after_ms: str = ""  # "", a number of milliseconds, or "p95" (docs/strategies.md)
    entries: tuple[EntrySpec, ...] = ()  # every entry, in position order
    allowed_user_ids: frozenset[Any] = frozenset()
    allowed_group_ids: frozenset[Any] = frozenset()
    # steps(), as build() computed it (None: computed on each call)
    grouped: tuple[tuple[str, tuple[EntrySpec, ...]], ...] | None = None

    def provider_names(self) -> list[tuple[str, str]]:
        """(provider name, model override) of the enabled entries, in position order
        (as :meth:`llm_routing.models.Chain.provider_names`)."""
        return [(e.provider, e.model) for e in self.entries if e.enabled]

    def steps(self) -> tuple[tuple[str, tuple[EntrySpec, ...]], ...]:
        """(strategy, enabled entries) per step, in order (:func:`models.group_steps`);
        a step of one has the strategy ``""``, a step of several its first entry's
        strategy (``weighted`` when none is set). Computed once per snapshot."""
        if self.grouped is None:
            return _steps(self.entries)
        return self.grouped

    @property
    def open_to_everyone(self) -> bool:
        return not self.allowed_user_ids and not self.allowed_group_ids

    def allows(self, principal: Principal) -> bool:
        """Whether ``principal`` may use this chain (docs/operations.md)."""
        if principal.can_route_any_provider or self.open_to_everyone:
            return True
        if principal.user_id is not None and principal.user_id in self.allowed_user_ids:
            return True
        return not self.allowed_group_ids.isdisjoint(principal.group_ids)


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """An enabled routing rule and its chain."""

    name: str
    priority: int
    route: str
    task_glob: str
    chain: ChainSpec

    def matches(self, *, task: str, route: str | None) -> bool:
        return rule_matches(self.route, self.task_glob, task=task, route=route)


@dataclass(frozen=True)
class ConfigSnapshot:
    """The routing configuration at one moment; never changes once built."""

    providers: Mapping[str, Provider] = field(default_factory=lambda: MappingProxyType({}))
    chains: Mapping[str, ChainSpec] = field(default_factory=lambda: MappingProxyType({}))
    rules: tuple[RuleSpec, ...] = ()  # enabled rules, by (priority, name)
    default_chain: ChainSpec | None = None
    version: str | None = None  # the shared version key's value it was built under

    def chain(self, name: str) -> ChainSpec | None:
        return self.chains.get(name)

    def provider(self, name: str) -> Provider | None:
        return self.providers.get(name)

    def rows(self, names: Iterable[str]) -> dict[str, Provider]:
        """The provider rows among ``names`` (unknown names are left out)."""
        return {n: row for n in names if (row := self.providers.get(n)) is not None}

    def first_matching_rule(
        self, *, task: str, route: str | None, principal: Principal | None = None
    ) -> RuleSpec | None:
        """The first enabled rule matching ``task`` and ``route`` whose chain
        ``principal`` may use (any, for None: trusted code). A rule leading to a chain
        the caller may not use does not apply to them: they are routed as if it did
        not exist (docs/operations.md, "Who sees what")."""
        for rule in self.rules:
            if rule.matches(task=task, route=route) and (
                principal is None or rule.chain.allows(principal)
            ):
                return rule
        return None

    def has_route_rule(self, route: str) -> bool:
        """Whether an enabled rule is keyed on exactly this route."""
        return any(rule.route == route for rule in self.rules)

    def allowed_chains(self, principal: Principal) -> list[ChainSpec]:
        """The chains ``principal`` may use, by name."""
        return [c for _, c in sorted(self.chains.items()) if c.allows(principal)]


def build(version: str | None = None, *, using: str | None = None) -> ConfigSnapshot:
    """Read the configuration rows into a new snapshot (six queries). A row that refers
    to one committed after an earlier query is left out: that commit's own version bump
    rebuilds the snapshot."""
    alias = using or db_router.db_for_read(Provider)
    providers = {p.name: p for p in Provider.objects.using(alias).order_by("name")}
    by_pk = {p.pk: p.name for p in providers.values()}
    entries: dict[int, list[EntrySpec]] = {}
    for chain_id, provider_id, position, model, enabled, step, weight, strategy in (
        ChainEntry.objects.using(alias)
        .order_by("chain_id", "position")
        .values_list(
            "chain_id", "provider_id", "position", "model", "enabled", "step", "weight", "strategy"
        )
    ):
        if provider_id in by_pk:
            entries.setdefault(chain_id, []).append(
                EntrySpec(by_pk[provider_id], position, model, enabled, step, weight, strategy)
            )
    users: dict[int, set[Any]] = {}
    for chain_id, user_id in Chain.allowed_users.through.objects.using(alias).values_list(
        "chain_id", "user_id"
    ):
        users.setdefault(chain_id, set()).add(user_id)
    groups: dict[int, set[Any]] = {}
    for chain_id, group_id in Chain.allowed_groups.through.objects.using(alias).values_list(
        "chain_id", "group_id"
    ):
        groups.setdefault(chain_id, set()).add(group_id)
    chains: dict[str, ChainSpec] = {}
    by_chain_pk: dict[int, ChainSpec] = {}
    for c in Chain.objects.using(alias).order_by("name"):
        spec = ChainSpec(
            name=c.name,
            is_default=c.is_default,
            stream_mode=c.stream_mode,
            mock_backstop=c.mock_backstop,
            affinity_from_user=c.affinity_from_user,
            hedge_after_ms=c.hedge_after_ms,
            entries=tuple(entries.get(c.pk, ())),
            grouped=_steps(entries.get(c.pk, ())),
            allowed_user_ids=frozenset(users.get(c.pk, ())),
            allowed_group_ids=frozenset(groups.get(c.pk, ())),
        )
        chains[c.name] = by_chain_pk[c.pk] = spec
    rules = tuple(
        RuleSpec(r.name, r.priority, r.route, r.task_glob, by_chain_pk[r.chain_id])
        for r in RoutingRule.objects.using(alias).filter(enabled=True).order_by("priority", "name")
        if r.chain_id in by_chain_pk
    )
    return ConfigSnapshot(
        providers=MappingProxyType(providers),
        chains=MappingProxyType(chains),
        rules=rules,
        default_chain=next((c for c in chains.values() if c.is_default), None),
        version=version,
    )


# --- the process's current snapshot -------------------------------------------------------


class _Holder:
    """This process's snapshot and when it was last checked against the version key."""

    def __init__(self) -> None:
        self.clock: Callable[[], float] = time.monotonic  # a fake clock in tests
        self.lock = threading.Lock()
        self.snapshot: ConfigSnapshot | None = None
        self.generation = 0  # bumped by every local change
        self.built_generation = -1  # the generation the snapshot was built at
        self.next_check_at = 0.0  # monotonic time the snapshot must be checked again
        self.built_at = 0.0
        # Cache failed: do not read the key for a while (on this holder's clock).
        self.backoff = CacheBackoff(CACHE_RETRY_S, clock=lambda: self.clock())

    def fresh(self, now: float) -> ConfigSnapshot | None:
        """The snapshot when no I/O is due to trust it (no local change, checked
        recently), else None."""
        snap = self.snapshot
        if snap is None or self.built_generation != self.generation:
            return None
        return snap if now < self.next_check_at else None


_holder = _Holder()


def _read_version() -> tuple[bool, str | None]:
    """(the cache answered, the version key's value)."""
    if not _holder.backoff.open():
        return False, None
    try:
        value = routing_cache().get(VERSION_KEY)
    except Exception:  # whatever the backend raises: fall back to the short TTL
        _holder.backoff.failed()
        return False, None
    return True, None if value is None else str(value)


def current() -> ConfigSnapshot:
    """This process's snapshot, rebuilt when a change is known (see the module doc)."""
    if (snap := _holder.fresh(_holder.clock())) is not None:
        return snap
    if _holder.snapshot is not None and queries_refused_here():
        return _holder.snapshot  # what this request's acurrent() read (module doc)
    return checked()


def checked() -> ConfigSnapshot:
    """:func:`current` without its event-loop answer: checks the version and rebuilds
    when due, wherever it runs (:func:`acurrent`'s worker thread; a test whose
    database connection lives on its loop's thread)."""
    now = _holder.clock()
    if (snap := _holder.fresh(now)) is not None:
        return snap
    with _holder.lock:
        now = _holder.clock()
        if (snap := _holder.fresh(now)) is not None:
            return snap  # another thread checked or rebuilt meanwhile
        generation = _holder.generation
        answered, version = _read_version()
        snap = _holder.snapshot
        # Trusted until the next check, never past its TTL (MAX_AGE_S while the cache
        # answers, FALLBACK_TTL_S while it fails).
        expires = _holder.built_at + (MAX_AGE_S if answered else FALLBACK_TTL_S)
        if (
            snap is not None
            and _holder.built_generation == generation
            and now < expires
            and (not answered or snap.version == version)
        ):
            _holder.next_check_at = min(now + CHECK_INTERVAL_S, expires)
            return snap
        snap = build(version)
        now = _holder.clock()
        _holder.snapshot, _holder.built_generation = snap, generation
        _holder.built_at = now
        ttl = MAX_AGE_S if answered else FALLBACK_TTL_S
        _holder.next_check_at = now + min(CHECK_INTERVAL_S, ttl)
        return snap


def unknown_chain(name: str | None, config: ConfigSnapshot | None = None) -> str | None:
    """The error message when ``name`` names no chain; None when it is empty or a chain.

    The one check behind every place a caller names a chain (``/audit/``, explain, the
    Python API; ``/v1`` answers 404 for an unknown model): a chain name that does not
    exist is an error naming it, never a silent fall back to the default chain."""
    if not name:
        return None
    config = config if config is not None else current()
    if config.chain(name) is not None:
        return None
    return f"There is no chain named {name!r}."


def _current_in_worker() -> ConfigSnapshot:
    try:
        return checked()
    finally:
        # A worker thread must not keep a database connection (or a pool slot).
        alias = db_router.db_for_read(Provider)
        if not connections[alias].in_atomic_block:
            connections[alias].close()


def latest() -> ConfigSnapshot | None:
    """The snapshot as last built in this process, with no I/O at all (None before the
    first build): for code on the event loop that runs right after :func:`acurrent`."""
    return _holder.snapshot


async def acurrent() -> ConfigSnapshot:
    """:func:`current` for async code: answers inline when no I/O is due, else checks
    and rebuilds in a worker thread (the event loop never waits on the database)."""
    if (snap := _holder.fresh(_holder.clock())) is not None:
        return snap
    return await sync_to_async(_current_in_worker, thread_sensitive=False)()


def clear() -> None:
    """Forget this process's snapshot (the next read rebuilds). For tests."""
    with _holder.lock:
        _holder.snapshot = None
        _holder.generation += 1
        _holder.backoff.reset()


def _bump_shared() -> None:
    try:
        routing_cache().set(VERSION_KEY, uuid.uuid4().hex, None)
    except Exception:  # other processes fall back on their short TTL while it fails
        _holder.backoff.failed()


def changed(using: str | None = None) -> None:
    """Record a configuration change: this process rebuilds on its next read, every
    other process within 1 s of the commit. Called by the signal receivers below; call
    it (from sync code: it registers an ``on_commit`` hook) after raw SQL that edits
    configuration tables."""
    with _holder.lock:
        _holder.generation += 1
    transaction.on_commit(_bump_shared, using=using)


def _on_change(sender: Any, **kwargs: Any) -> None:
    changed(using=kwargs.get("using"))


def _on_m2m(sender: Any, action: str, **kwargs: Any) -> None:
    if action.startswith("post_"):
        changed(using=kwargs.get("using"))


config_changed.connect(_on_change, dispatch_uid="llmr-snapshot-bulk")
for _model in (Provider, Chain, ChainEntry, RoutingRule):
    post_save.connect(_on_change, sender=_model, dispatch_uid=f"llmr-snapshot-save-{_model}")
    post_delete.connect(_on_change, sender=_model, dispatch_uid=f"llmr-snapshot-del-{_model}")
for _through in (Chain.allowed_users.through, Chain.allowed_groups.through):
    m2m_changed.connect(_on_m2m, sender=_through, dispatch_uid=f"llmr-snapshot-m2m-{_through}")
