"""The routing algorithm (DESIGN §3) — the only place that walks a chain.

1. Resolve the chain: ``force_provider`` (mode ``forced``) → exactly that provider;
   otherwise the first matching enabled RoutingRule (``rule``), else the default
   Chain, else ``LLM_ROUTING["ROUTES"][route]`` / ``["DEFAULT_CHAIN"]`` (``default``);
   an explicit ``provider`` (``explicit``) goes first. Candidates are
   ``[primary, *fallbacks, "mock"]``, de-duplicated, mock always last.
2. Availability: ``unknown_provider``, ``disabled``, ``missing_key``, ``circuit_open``,
   ``unsupported`` — each skip recorded and announced through ``on_provider_fallback``.
3. Attempt through the retry layer; transient and context-length failures advance,
   anything else stops the walk with that error result.
4. Exhausted → the mock answers.

:func:`route` never raises on a well-formed :class:`AuditRequest`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .conf import routing_settings
from .errors import ResponseError
from .models import Chain, Provider, RoutingRule
from .providers.base import BaseProvider
from .providers.registry import get_adapter, is_known_kind
from .recorder import record
from .resilience import breaker
from .resilience.budget import Budget
from .resilience.retry import call_with_retries
from .signals import after_provider_result, before_provider_call, on_provider_fallback, send
from .types import (
    MOCK_PROVIDER_NAME,
    AttemptRecord,
    AuditRequest,
    ErrorInfo,
    ProviderConfig,
    ProviderResult,
    RouterMode,
    RoutingMetadata,
    RoutingResult,
)

__all__ = ["Plan", "resolve", "route"]

logger = logging.getLogger("llm_routing.router")

Sleeper = Callable[[float], None]


@dataclass(frozen=True)
class Plan:
    """Step 1's answer: which candidates, in which order, and why."""

    router_mode: RouterMode
    candidates: tuple[tuple[str, str], ...]  # (provider name, model override)
    chain_name: str | None = None
    rule: str | None = None
    requested_provider: str | None = None
    configured: bool = True  # False when nothing but the mock backstop was found

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.candidates)


def _dedup_mock_last(
    entries: list[tuple[str, str]], *, add_mock: bool
) -> tuple[tuple[str, str], ...]:
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    mock_entry: tuple[str, str] = (MOCK_PROVIDER_NAME, "")
    for name, model in entries:
        if name in seen:
            continue
        seen.add(name)
        if name == MOCK_PROVIDER_NAME:
            mock_entry = (name, model)
            continue
        out.append((name, model))
    if add_mock or MOCK_PROVIDER_NAME in seen:
        out.append(mock_entry)
    return tuple(out)


def resolve(request: AuditRequest) -> Plan:
    """Step 1 of the algorithm (reads configuration rows, writes nothing)."""
    if request.force_provider:
        return Plan(
            router_mode="forced",
            candidates=((request.force_provider, ""),),
            requested_provider=request.force_provider,
        )
    fallbacks: list[tuple[str, str]] = []
    chain_name: str | None = None
    rule_name: str | None = None
    mode: RouterMode = "default"
    for rule in RoutingRule.objects.filter(enabled=True).select_related("chain"):
        if rule.matches(task=request.task, route=request.route):
            fallbacks = rule.chain.provider_names()
            chain_name, rule_name, mode = rule.chain.name, rule.name, "rule"
            break
    else:
        routes = routing_settings.ROUTES or {}
        default = Chain.objects.filter(is_default=True).first()
        if request.route and request.route in routes:
            fallbacks = [(str(n), "") for n in routes[request.route]]
            chain_name = f"route:{request.route}"
        elif default is not None:
            fallbacks = default.provider_names()
            chain_name = default.name
        elif routing_settings.DEFAULT_CHAIN:
            fallbacks = [(str(n), "") for n in routing_settings.DEFAULT_CHAIN]
            chain_name = "settings"
    entries = list(fallbacks)
    if request.provider == MOCK_PROVIDER_NAME:
        # The mock never fails, so an explicit mock primary is the whole walk.
        entries = [(MOCK_PROVIDER_NAME, "")]
        mode = "explicit"
    elif request.provider:
        entries.insert(0, (request.provider, ""))
        mode = "explicit"
    return Plan(
        router_mode=mode,
        candidates=_dedup_mock_last(entries, add_mock=True),
        chain_name=chain_name,
        rule=rule_name,
        requested_provider=request.provider,
        configured=bool(entries),
    )


def _mock_config(row: Provider | None) -> ProviderConfig:
    if row is not None:
        config = row.to_config()
        # The backstop is always available and always offline.
        return replace(config, kind="mock", mode="mock", enabled=True)
    return ProviderConfig(
        name=MOCK_PROVIDER_NAME, kind="mock", model=routing_settings.MOCK_MODEL, mode="mock"
    )


def _skip_reason(
    name: str, row: Provider | None, adapter: BaseProvider | None, request: AuditRequest
) -> str | None:
    if name == MOCK_PROVIDER_NAME:
        return None
    if row is None:
        return "unknown_provider"
    if not row.enabled:
        return "disabled"
    if adapter is None:
        return "unknown_provider"
    if adapter.requires_key and not row.key_present:
        return "missing_key"
    if request.response_schema is not None and not adapter.supports("structured_output"):
        return "unsupported"
    if request.stream and not adapter.supports("streaming"):
        return "unsupported"
    if not breaker.allow(adapter.config):
        return "circuit_open"
    return None


def _adapter_for(name: str, model: str, row: Provider | None) -> BaseProvider | None:
    if name == MOCK_PROVIDER_NAME:
        config = _mock_config(row)
    elif row is None or not is_known_kind("mock" if row.mode == "mock" else row.kind):
        return None
    else:
        config = row.to_config()
    if model:
        config = config.with_model(model)
    try:
        return get_adapter(config)
    except Exception:  # an import error in a custom adapter must not crash routing
        logger.exception("Cannot build adapter for provider %s", name)
        return None


@dataclass
class _Walk:
    request_id: str
    attempts: list[AttemptRecord] = field(default_factory=list)

    def add(self, **kwargs: object) -> AttemptRecord:
        attempt = AttemptRecord(index=len(self.attempts), **kwargs)  # type: ignore[arg-type]
        self.attempts.append(attempt)
        return attempt


def _call(
    adapter: BaseProvider,
    request: AuditRequest,
    walk: _Walk,
    budget: Budget,
    sleeper: Sleeper | None,
) -> ProviderResult:
    config = adapter.config
    send(
        before_provider_call,
        request_id=walk.request_id,
        provider=config.name,
        model=config.model,
        task=request.task,
    )
    # A half-open probe is exactly one upstream request: no same-provider retries.
    max_retries = 0 if breaker.is_probe(config) else None
    if sleeper is None:
        result = call_with_retries(adapter, request, budget=budget, max_retries=max_retries)
    else:
        result = call_with_retries(
            adapter, request, budget=budget, sleeper=sleeper, max_retries=max_retries
        )
    breaker.observe(config, result)
    send(after_provider_result, request_id=walk.request_id, provider=config.name, result=result)
    return result


def _attempt_record(result: ProviderResult, *, served: bool) -> dict[str, object]:
    err = result.error
    return {
        "provider": result.provider,
        "model": result.model,
        "outcome": "ok" if result.ok else "error",
        "reason": err.category if err else None,
        "error_category": err.category if err else None,
        "http_status": err.http_status if err else None,
        "transient": err.transient if err else False,
        "retries": result.retries,
        "latency_ms": result.latency_ms,
        "served": served,
    }


def _skip_result(name: str, model: str, reason: str) -> ProviderResult:
    """The adapter state of a provider that could not run (forced mode only)."""
    if reason in {"disabled", "missing_key"}:
        mode, status = "disabled", "fallback"
        message = (
            "The provider is disabled."
            if reason == "disabled"
            else "The provider's key variable is not set."
        )
    else:
        mode, status = "error", "error"
        message = {
            "unknown_provider": "No provider has that name.",
            "unsupported": "The provider lacks a capability this request needs.",
            "circuit_open": "The provider's circuit is open.",
        }.get(reason, reason)
    return ProviderResult(
        provider=name,
        model=model,
        mode=mode,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        error=ErrorInfo(category=reason, message=message),
    )


def route(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Sleeper | None = None,
    persist: bool = True,
) -> RoutingResult:
    """Route one request and record it. Never raises on a well-formed request."""
    started = time.perf_counter()
    walk = _Walk(request_id=request_id or str(uuid.uuid4()))
    plan = resolve(request)
    rows = {p.name: p for p in Provider.objects.filter(name__in=plan.names)}
    budget = Budget(
        deadline_s=float(routing_settings.REQUEST_DEADLINE_S),
        max_attempts=int(routing_settings.MAX_ATTEMPTS),
    )
    if plan.router_mode == "forced":
        final, fallback_reason = _route_forced(plan, rows, request, walk, budget, sleeper)
    else:
        final, fallback_reason = _walk(plan, rows, request, walk, budget, sleeper)

    served = next((a for a in walk.attempts if a.served), None)
    metadata = RoutingMetadata(
        request_id=walk.request_id,
        router_mode=plan.router_mode,
        route=request.route,
        rule=plan.rule,
        chain_name=plan.chain_name,
        requested_provider=plan.requested_provider,
        selected_provider=final.provider,
        chain=plan.names,
        attempts=tuple(walk.attempts),
        fallback_used=fallback_reason is not None,
        fallback_reason=fallback_reason,
    )
    routed = RoutingResult(
        request_id=walk.request_id,
        result=final,
        metadata=metadata,
        total_latency_ms=(time.perf_counter() - started) * 1000,
    )
    if persist:
        try:
            record(request, routed)
        except Exception:
            logger.exception("Could not record routing decision %s", walk.request_id)
    logger.info(
        "routed request_id=%s task=%s mode=%s selected=%s served=%s fallback=%s",
        walk.request_id,
        request.task,
        plan.router_mode,
        final.provider,
        served.provider if served else None,
        fallback_reason,
    )
    return routed


def _route_forced(
    plan: Plan,
    rows: dict[str, Provider],
    request: AuditRequest,
    walk: _Walk,
    budget: Budget,
    sleeper: Sleeper | None,
) -> tuple[ProviderResult, str | None]:
    """Exactly the forced provider: no skipping, no mock substitution."""
    name = plan.names[0]
    row = rows.get(name)
    adapter = _adapter_for(name, "", row)
    reason: str | None = None
    if name != MOCK_PROVIDER_NAME:
        if row is None or adapter is None:
            reason = "unknown_provider"
        elif not row.enabled:
            reason = "disabled"
        elif adapter.requires_key and not row.key_present:
            reason = "missing_key"
        elif request.response_schema is not None and not adapter.supports("structured_output"):
            reason = "unsupported"
        elif request.stream and not adapter.supports("streaming"):
            reason = "unsupported"
    if reason is not None or adapter is None:
        reason = reason or "unknown_provider"
        model = row.model if row else ""
        walk.add(provider=name, model=model, outcome="skipped", reason=reason)
        return _skip_result(name, model, reason), None
    result = _call(adapter, request, walk, budget, sleeper)
    walk.add(**_attempt_record(result, served=result.ok))
    return result, None


def _walk(
    plan: Plan,
    rows: dict[str, Provider],
    request: AuditRequest,
    walk: _Walk,
    budget: Budget,
    sleeper: Sleeper | None,
) -> tuple[ProviderResult, str | None]:
    first_reason: str | None = None
    any_attempted = False
    for position, (name, model) in enumerate(plan.candidates):
        row = rows.get(name)
        adapter = _adapter_for(name, model, row)
        reason = _skip_reason(name, row, adapter, request)
        if reason is not None:
            shown_model = model or (row.model if row else "")
            walk.add(provider=name, model=shown_model, outcome="skipped", reason=reason)
            first_reason = first_reason or reason
            send(on_provider_fallback, request_id=walk.request_id, provider=name, reason=reason)
            continue
        assert adapter is not None  # _skip_reason returns a reason when it is None
        is_backstop = name == MOCK_PROVIDER_NAME and position == len(plan.candidates) - 1
        result = _call(adapter, request, walk, budget, sleeper)
        if result.ok:
            walk.add(**_attempt_record(result, served=True))
            if position == 0 and plan.configured:
                return result, None
            if is_backstop and any_attempted:
                return result, "chain_exhausted"
            return result, first_reason or ("no_chain" if not plan.configured else None)
        any_attempted = True
        walk.add(**_attempt_record(result, served=False))
        category = result.error.category if result.error else "response"
        first_reason = first_reason or category
        if not _advances(result):
            return result, first_reason if position > 0 else None
        send(on_provider_fallback, request_id=walk.request_id, provider=name, reason=category)
    # Only reachable if the mock backstop itself failed (a broken custom mock kind).
    exc = ResponseError("Every candidate failed, the mock backstop included.")
    last = walk.attempts[-1] if walk.attempts else None
    return (
        ProviderResult(
            provider=last.provider if last else MOCK_PROVIDER_NAME,
            model=last.model if last else "",
            mode="error",
            status="error",
            error=exc.to_info(),
        ),
        "chain_exhausted",
    )


def _advances(result: ProviderResult) -> bool:
    if result.error is None:
        return True
    if result.error.transient:
        return True
    return result.error.category == "context_length"
