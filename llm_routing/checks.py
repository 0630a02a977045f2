"""System checks. Messages, hints and ids live together in :data:`MESSAGES`.

====================  ==========================================================
id                    meaning
====================  ==========================================================
llm_routing.E001      unknown key in settings.LLM_ROUTING
llm_routing.E002      LLM_ROUTING is not a dict / a value has the wrong type
llm_routing.E003      a provider row has an unknown kind
llm_routing.E004      a provider's api_key_env fails validation (pattern, deny-list)
llm_routing.E005      RECORD_MODE is neither "inline" nor "write_behind"
llm_routing.E006      ASYNC_HTTP_TRANSPORT is neither "aiohttp" nor "httpx"
llm_routing.W001      an enabled provider's key variable is missing (unset/empty)
llm_routing.W002      a chain has no enabled entry with an enabled provider
llm_routing.W003      write-behind recording without SPOOL_DIR (refused batches are lost)
llm_routing.W004      ASYNC_HTTP_TRANSPORT is "aiohttp" but httpx-aiohttp cannot be
                      imported: the async upstream client uses httpcore
llm_routing.W005      a step of several entries whose enabled weights sum to 0 (drained)
llm_routing.W006      a chain hedges (hedge_after_ms) but has one usable candidate: there
                      is nobody to hedge with
llm_routing.I001      no default chain in the database and no DEFAULT_CHAIN setting
llm_routing.W010      httpx / httpcore debug logging is on (it logs request headers)
llm_routing.E010      HTTP_MAX_CONNECTIONS / HTTP_MAX_KEEPALIVE are not usable pool limits
llm_routing.E020      the routing cache is process-local (LocMem) and several worker
                      processes serve (WEB_CONCURRENCY / GUNICORN_CMD_ARGS)
llm_routing.W020-028  a private seam of Django/asgiref/DRF/httpcore moved: its
                      fallback is in use (llm_routing.seams)
====================  ==========================================================

E003, E004, W001, W002, W005, W006 and I001 read the configuration rows. They are registered with
the ``database`` tag, so they run on ``manage.py check --database default``, before
``migrate`` applies migrations (they skip silently while the tables do not exist yet)
and in ``manage.py llm_routing_check``; plain ``manage.py check`` never opens a
database connection for them.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError, connections, router

from .conf import DEFAULTS, routing_settings

if TYPE_CHECKING:
    from .types import ProviderConfig

__all__ = [
    "MESSAGES",
    "check_configuration_rows",
    "check_http_debug_logging",
    "check_private_seams",
    "check_settings",
    "check_shared_cache",
    "requires_key",
    "worker_processes",
]

MESSAGES: dict[str, tuple[str, str]] = {
    "E001": (
        "Unknown LLM_ROUTING setting(s): {keys}.",
        "Remove or rename them; valid keys are listed in docs/configuration.md.",
    ),
    "E002": (
        "LLM_ROUTING is malformed: {detail}.",
        "LLM_ROUTING must be a dict; see docs/configuration.md for each key's type.",
    ),
    "E003": (
        "Provider {name!r} has the unknown kind {kind!r}.",
        "Use a built-in kind ({known}) or register the adapter in "
        "LLM_ROUTING['PROVIDER_KINDS']. The router skips this provider (unknown_provider).",
    ),
    "E004": (
        "Provider {name!r} has an invalid key variable name: {detail}",
        "api_key_env holds the NAME of an environment variable (A-Z, 0-9, _), never the key, "
        "and may not name a deployment secret such as SECRET_KEY or DATABASE_URL.",
    ),
    "E005": (
        "LLM_ROUTING['RECORD_MODE'] is {value!r}.",
        'Use "inline" (the decision is written before the router returns) or '
        '"write_behind" (queued for a background writer); see docs/production.md.',
    ),
    "E006": (
        "LLM_ROUTING['ASYNC_HTTP_TRANSPORT'] is {value!r}.",
        'Use "aiohttp" (httpx over aiohttp, the default) or "httpx" (httpcore) for the async '
        "upstream client; see docs/configuration.md. Until then httpcore serves.",
    ),
    "W001": (
        "Provider {name!r} is enabled but {problem}.",
        "Set the variable in the environment of every web and worker process, or disable "
        "the provider. Until then the router skips it (missing_key).",
    ),
    "W002": (
        "Chain {name!r} has no enabled entry with an enabled provider{detail}.",
        "Enable an entry (or its provider) in the admin, or add one; until then every "
        "request routed to this chain is answered by the mock backstop.",
    ),
    "W003": (
        "Write-behind recording is on but LLM_ROUTING['SPOOL_DIR'] is not set.",
        "Set SPOOL_DIR to a local, persistent directory: without it a batch the database "
        "refuses, or a decision that finds the queue full, is only logged as lost.",
    ),
    "W004": (
        "LLM_ROUTING['ASYNC_HTTP_TRANSPORT'] is \"aiohttp\" but it cannot be used ({reason}).",
        "The async upstream client falls back to httpx/httpcore (correct, slower per call). "
        "Install httpx-aiohttp>=0.2,<0.3 (it brings aiohttp), or set "
        'ASYNC_HTTP_TRANSPORT to "httpx" to choose httpcore (docs/production.md).',
    ),
    "W005": (
        "Chain {name!r}: step {step} ({strategy}) has weights summing to 0, so every entry "
        "of it is drained.",
        "Give at least one enabled entry of the step a positive weight; until then the "
        "walk skips the whole step (drained) and goes on to the next (docs/strategies.md).",
    ),
    "W006": (
        "Chain {name!r} hedges (hedge_after_ms = {hedge}) but has {count} usable candidate: "
        "there is nobody to hedge with.",
        "Add a second enabled entry to the chain, or clear hedge_after_ms; the mock "
        "backstop is never a hedge (docs/strategies.md).",
    ),
    "I001": (
        "No default chain is configured.",
        "Mark a chain as default in the admin, or set LLM_ROUTING['DEFAULT_CHAIN'] (the demo "
        "project reads LLM_PROVIDER_CHAIN). Requests that match no rule are answered by the "
        "mock backstop.",
    ),
    "W010": (
        "Debug logging is enabled for {loggers}: request lines and headers of provider "
        "calls are logged.",
        "Set these loggers to INFO or higher in production; llm_routing redacts known key "
        "values from their records, but headers of other services are not covered.",
    ),
    "E010": (
        "The HTTP connection-pool limits are invalid: {detail}.",
        "HTTP_MAX_CONNECTIONS and HTTP_MAX_KEEPALIVE are whole numbers of at least 1, and "
        "HTTP_MAX_KEEPALIVE is at most HTTP_MAX_CONNECTIONS (see docs/configuration.md).",
    ),
    "E020": (
        "The routing cache {alias!r} is process-local ({backend}) and {workers} worker "
        "processes serve ({source}): each keeps its own circuits, throttle counts and "
        "budget counters.",
        "Point LLM_ROUTING['REDIS_URL'] (or the cache {alias!r}) at Redis so the workers "
        "share them: throttles and budgets are otherwise multiplied by the number of "
        "workers, and a dead provider is retried by each (docs/production.md).",
    ),
}

#: W020-W028 (one per seam of llm_routing.seams): one template; the seam names what
#: moved and what runs instead.
SEAM_MESSAGE = (
    "{relies_on} is not usable with the installed versions ({reason}).",
    "llm_routing falls back: {fallback}. Correct, but slower; an upgrade of "
    "django-llm-routing may restore it (docs/production.md, 'Private seams').",
)


def _message(
    level: Callable[..., checks.CheckMessage], code: str, **params: Any
) -> checks.CheckMessage:
    text, hint = MESSAGES[code]
    return level(text.format(**params), hint=hint, id=f"llm_routing.{code}")


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        unknown = routing_settings.unknown_keys()
    except ImproperlyConfigured as exc:
        return [_message(checks.Error, "E002", detail=str(exc))]
    errors: list[checks.CheckMessage] = []
    if unknown:
        errors.append(_message(checks.Error, "E001", keys=", ".join(unknown)))
    user = routing_settings.user_settings
    for key in ("DEFAULT_CHAIN", "BREAKER_COOLDOWNS_S"):
        if key in user and not isinstance(user[key], list | tuple):
            errors.append(_message(checks.Error, "E002", detail=f"{key} must be a list"))
    for key in ("ROUTES", "PROVIDER_KINDS", "API_THROTTLE_RATES"):
        if key in user and not isinstance(user[key], dict):
            errors.append(_message(checks.Error, "E002", detail=f"{key} must be a dict"))
    spool_dir = user.get("SPOOL_DIR")
    if spool_dir is not None and not isinstance(spool_dir, str | os.PathLike):
        errors.append(_message(checks.Error, "E002", detail="SPOOL_DIR must be a path or None"))
    if user.get("REDIS_URL") is not None:
        from .cache import redis_url_problem

        problem = redis_url_problem(user["REDIS_URL"])
        if problem:
            errors.append(_message(checks.Error, "E002", detail=problem))
    mode = user.get("RECORD_MODE", "inline")
    if mode not in ("inline", "write_behind"):
        errors.append(_message(checks.Error, "E005", value=mode))
    elif mode == "write_behind" and not user.get("SPOOL_DIR"):
        errors.append(_message(checks.Warning, "W003"))
    errors.extend(_async_transport_messages(user))
    if isinstance(user.get("RECORD_QUEUE_SIZE"), bool | float):  # the rest: below
        detail = "RECORD_QUEUE_SIZE must be a whole number of records"
        errors.append(_message(checks.Error, "E002", detail=detail))
    for key, default in DEFAULTS.items():
        if (
            key in user
            and isinstance(default, int | float)
            and not isinstance(default, bool)
            and (not isinstance(user[key], int | float) or user[key] <= 0)
        ):
            errors.append(_message(checks.Error, "E002", detail=f"{key} must be a positive number"))
    errors.extend(_pool_limit_messages(user))
    if not unknown and not errors:
        from .resilience.breaker import Policy

        try:
            Policy.from_settings()
        except ImproperlyConfigured as exc:
            errors.append(_message(checks.Error, "E002", detail=str(exc).rstrip(".")))
    return errors


def _async_transport_messages(user: dict[str, Any]) -> list[checks.CheckMessage]:
    """E006: ASYNC_HTTP_TRANSPORT is not a known transport; W004: it asks for aiohttp,
    which cannot be imported (httpcore serves: llm_routing.providers.aio)."""
    from .providers.aio import TRANSPORTS, unavailable_reason

    value = user.get("ASYNC_HTTP_TRANSPORT", DEFAULTS["ASYNC_HTTP_TRANSPORT"])
    if not isinstance(value, str) or value not in TRANSPORTS:
        return [_message(checks.Error, "E006", value=value)]
    reason = unavailable_reason() if value == "aiohttp" else None
    if reason is not None:
        return [_message(checks.Warning, "W004", reason=reason)]
    return []


def _pool_limit_messages(user: dict[str, Any]) -> list[checks.CheckMessage]:
    """E010: the adapters' connection-pool bounds (httpx.Limits) must be whole numbers
    of at least 1, the idle bound within the total."""
    limits = {
        key: user.get(key, DEFAULTS[key]) for key in ("HTTP_MAX_CONNECTIONS", "HTTP_MAX_KEEPALIVE")
    }
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            return []  # not a positive number: E002 says so
        if not isinstance(value, int):
            return [_message(checks.Error, "E010", detail=f"{key} must be a whole number")]
    if limits["HTTP_MAX_KEEPALIVE"] > limits["HTTP_MAX_CONNECTIONS"]:
        return [
            _message(
                checks.Error,
                "E010",
                detail="HTTP_MAX_KEEPALIVE is larger than HTTP_MAX_CONNECTIONS",
            )
        ]
    return []


def _tables_exist(alias: str, *tables: str) -> bool:
    try:
        with connections[alias].cursor() as cursor:
            existing = set(connections[alias].introspection.table_names(cursor))
    except DatabaseError:
        return False
    return set(tables) <= existing


@checks.register(checks.Tags.database)
def check_configuration_rows(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Checks over Provider/Chain rows: E003, E004, W001, W002, W005, W006, I001."""
    from .models import Chain, ChainEntry, Provider, group_steps

    alias = router.db_for_read(Provider) or "default"
    if not databases or alias not in databases:
        return []
    if not _tables_exist(
        alias, Provider._meta.db_table, Chain._meta.db_table, ChainEntry._meta.db_table
    ):
        return []  # before migrate
    messages: list[checks.CheckMessage] = []
    try:
        providers = list(Provider.objects.using(alias).order_by("name"))
        for provider in providers:
            messages.extend(_provider_messages(provider))
        for chain in (
            Chain.objects.using(alias).order_by("name").prefetch_related("entries__provider")
        ):
            usable = [e for e in chain.entries.all() if e.enabled and e.provider.enabled]
            if not usable:
                detail = "" if chain.entries.all() else " (it has no entries)"
                messages.append(_message(checks.Warning, "W002", name=chain.name, detail=detail))
            real = {(e.provider.name, e.model) for e in usable if e.provider.kind != "mock"}
            if chain.hedge_after_ms and len(real) < 2:
                messages.append(
                    _message(checks.Warning, "W006", name=chain.name,
                             hedge=chain.hedge_after_ms, count=len(real))
                )  # fmt: skip
            entries = sorted(chain.entries.all(), key=lambda e: e.position)
            for number, step in enumerate(group_steps(entries)):
                live = [e for e in step if e.enabled]
                if len(step) > 1 and live and sum(e.weight for e in live) <= 0:
                    strategy = step[0].strategy or "weighted"
                    messages.append(
                        _message(
                            checks.Warning, "W005", name=chain.name, step=number, strategy=strategy
                        )
                    )
        has_default = Chain.objects.using(alias).filter(is_default=True).exists()
    except DatabaseError:
        return messages
    if not has_default and not routing_settings.DEFAULT_CHAIN:
        messages.append(_message(checks.Info, "I001"))
    return messages


def _provider_messages(provider: Any) -> list[checks.CheckMessage]:
    from .providers.registry import is_known_kind, known_kinds
    from .validators import validate_api_key_env

    if not is_known_kind(provider.kind):
        return [
            _message(
                checks.Error,
                "E003",
                name=provider.name,
                kind=provider.kind,
                known=", ".join(known_kinds()),
            )
        ]
    try:
        validate_api_key_env(provider.api_key_env)
    except ValidationError as exc:
        detail = " ".join(str(m) for m in exc.messages)
        return [_message(checks.Error, "E004", name=provider.name, detail=detail)]
    if not provider.enabled or provider.mode == "mock":
        return []
    if not requires_key(provider.kind, provider.to_config()) or provider.key_present:
        return []
    if provider.api_key_env:
        problem = f"its key variable {provider.api_key_env} is unset or empty"
    else:
        problem = "it names no key variable (api_key_env is empty)"
    return [_message(checks.Warning, "W001", name=provider.name, problem=problem)]


def requires_key(kind: str, config: ProviderConfig | None = None) -> bool:
    """Whether the adapter of ``kind`` needs a key (True when it cannot be imported).

    An adapter may decide per row (``openai_compatible`` needs a key only when the row
    names a variable): with *config*, the answer is the adapter instance's, as the
    router sees it.
    """
    from .providers.registry import get_adapter_class

    try:
        cls = get_adapter_class(kind)
    except ImproperlyConfigured:
        return True  # the BaseProvider default; import errors surface on use
    if config is not None:
        try:
            return bool(cls(config).requires_key)
        except Exception:  # an adapter that cannot be built: its errors surface on use
            return True
    flag = inspect.getattr_static(cls, "requires_key", True)
    return flag if isinstance(flag, bool) else True


@checks.register(checks.Tags.security)
def check_http_debug_logging(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    noisy = [
        name
        for name in ("httpx", "httpcore")
        if logging.getLogger(name).isEnabledFor(logging.DEBUG)
    ]
    if noisy:
        return [_message(checks.Warning, "W010", loggers=", ".join(noisy))]
    return []


@checks.register()
def check_private_seams(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W020-W028: a private seam whose guard found it moved (:mod:`llm_routing.seams`)."""
    from . import seams

    messages: list[checks.CheckMessage] = []
    for seam in seams.seams():
        reason = seams.broken(seam.code)
        if reason is not None:
            text, hint = SEAM_MESSAGE
            params = {"relies_on": seam.relies_on, "reason": reason, "fallback": seam.fallback}
            messages.append(
                checks.Warning(
                    text.format(**params),
                    hint=hint.format(**params),
                    id=f"llm_routing.{seam.code}",
                )
            )
    return messages


def worker_processes() -> tuple[int, str]:
    """How many worker processes serve this deployment, and where that was read: the
    ``WEB_CONCURRENCY`` variable (gunicorn's and uvicorn's default worker count; the
    shipped gunicorn.conf.py reads and exports it), else ``-w`` / ``--workers`` in
    ``GUNICORN_CMD_ARGS``; 1 when neither says."""
    value = os.environ.get("WEB_CONCURRENCY", "").strip()
    if value.isdigit():
        return int(value), "WEB_CONCURRENCY"
    args = os.environ.get("GUNICORN_CMD_ARGS", "").replace("=", " ").split()
    for flag, count in itertools.pairwise(args):
        if flag in ("-w", "--workers") and count.isdigit():
            return int(count), "GUNICORN_CMD_ARGS"
    return 1, "a single process"


@checks.register()
def check_shared_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E020: the routing cache is LocMem (one per process) in a multi-worker deployment."""
    from django.conf import settings

    if routing_settings.REDIS_URL:
        return []  # the app's state lives in that Redis
    alias = routing_settings.CACHE_ALIAS
    backend = str(settings.CACHES.get(alias, {}).get("BACKEND", ""))
    if backend != "django.core.cache.backends.locmem.LocMemCache":
        return []
    workers, source = worker_processes()
    if workers <= 1:
        return []
    return [
        _message(
            checks.Error,
            "E020",
            alias=alias,
            backend="LocMemCache",
            workers=workers,
            source=f"{source}={workers}" if source != "a single process" else source,
        )
    ]
