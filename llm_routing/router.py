"""The routing algorithm — the only place that walks a chain (docs/architecture.md).

1. Resolve the chain: ``force_provider`` (mode ``forced``) → exactly that provider;
   otherwise the first matching enabled RoutingRule (``rule``), else the default
   Chain, else ``LLM_ROUTING["ROUTES"][route]`` / ``["DEFAULT_CHAIN"]`` (``default``);
   a chain named by the caller (``chain``, the ``/v1`` face's ``model``) replaces both;
   an explicit ``provider`` (``explicit``) goes first. Candidates are
   ``[primary, *fallbacks, "mock"]``, de-duplicated, mock always last.
2. Availability: ``unknown_provider``, ``disabled``, ``missing_key``, ``circuit_open``,
   ``unsupported`` (a capability the request needs — :func:`missing_capability`),
   ``budget_exhausted`` (the request-wide deadline or attempt budget
   leaves no room for a real call) — each skip recorded and announced through
   ``on_provider_fallback``.
3. Attempt through the retry layer; transient and context-length failures advance,
   anything else stops the walk with that error result.
4. Exhausted → the mock answers; without a backstop (``request.backstop`` False and
   no ``Chain.mock_backstop``, as on ``/v1``) → an error result ``chain_exhausted``.

:func:`route` never raises on a well-formed :class:`AuditRequest`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from . import effects, recorder
from .access import denied_candidates
from .availability import may_try, missing_capability
from .conf import routing_settings
from .dbconn import release_pooled_connections
from .effects import (
    AsyncSleeper,
    ClientGone,
    CloseStream,
    Context,
    Effect,
    Emit,
    NextEvent,
    OpenStream,
    Steps,
)
from .errors import ClientDisconnectedError, NetworkError, ProviderError, ResponseError
from .explanation import CandidateExplanation, Explanation
from .models import Provider
from .providers.base import BaseProvider, validate_structured
from .providers.mock import MockProvider
from .providers.registry import get_adapter, is_known_kind
from .resilience import breaker
from .resilience.breaker import Observe
from .resilience.budget import Budget
from .resilience.retry import InvokeSteps, deadline_caused, error_result, retry_steps
from .sanitize import StreamGuard, redacted, sanitized, scrub_error
from .signals import (
    after_provider_result,
    asend,
    before_provider_call,
    on_provider_fallback,
    request_routed,
    send,
)
from .snapshot import ConfigSnapshot, RuleSpec, acurrent, current
from .types import (
    MOCK_PROVIDER_NAME,
    AttemptRecord,
    AuditRequest,
    ErrorInfo,
    ProviderConfig,
    ProviderResult,
    RouterMode,
    RouterStreamEvent,
    RoutingMetadata,
    RoutingResult,
    StreamChunk,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamFailure,
    StreamResult,
    StreamToolCallDelta,
    ToolCall,
    ToolCallDelta,
    assemble_tool_calls,
)

__all__ = [
    "STREAM_MODES",
    "CandidateExplanation",
    "Explanation",
    "Plan",
    "aroute",
    "aroute_stream",
    "explain",
    "missing_capability",
    "resolve",
    "route",
    "route_stream",
]

logger = logging.getLogger("llm_routing.router")

Sleeper = Callable[[float], None]
T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """Step 1's answer: which candidates, in which order, and why."""

    router_mode: RouterMode
    candidates: tuple[tuple[str, str], ...]  # (provider name, model override)
    chain_name: str | None = None
    rule: str | None = None
    requested_provider: str | None = None
    configured: bool = True  # False when nothing but the mock backstop was found
    stream_mode: str = "direct"  # the chain's mid-stream failure policy
    backstop: bool = True  # whether the mock backstop ends the candidates

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


def _first_matching_rule(request: AuditRequest, config: ConfigSnapshot) -> RuleSpec | None:
    return config.first_matching_rule(
        task=request.task, route=request.route, principal=request.principal
    )


def resolve(request: AuditRequest, config: ConfigSnapshot | None = None) -> Plan:
    """Step 1 of the algorithm (reads the config snapshot — no rows — writes nothing)."""
    config = config if config is not None else current()
    if request.force_provider:
        return Plan(
            router_mode="forced",
            candidates=((request.force_provider, ""),),
            requested_provider=request.force_provider,
        )
    fallbacks: list[tuple[str, str]] = []
    stream_mode = "direct"
    chain_backstop = False  # the chain's own opt-in (Chain.mock_backstop)
    chain_name: str | None = None
    rule_name: str | None = None
    mode: RouterMode = "default"
    named = config.chain(request.chain) if request.chain else None
    rule = None if named is not None else _first_matching_rule(request, config)
    routes = routing_settings.ROUTES or {}
    if named is not None:
        fallbacks = named.provider_names()
        chain_name, mode, stream_mode = named.name, "chain", named.stream_mode
        chain_backstop = named.mock_backstop
    elif rule is not None:
        fallbacks = rule.chain.provider_names()
        chain_name, rule_name, mode = rule.chain.name, rule.name, "rule"
        stream_mode = rule.chain.stream_mode
        chain_backstop = rule.chain.mock_backstop
    elif request.route and request.route in routes:
        fallbacks = [(str(n), "") for n in routes[request.route]]
        chain_name = f"route:{request.route}"
    elif (default := config.default_chain) is not None:
        fallbacks = default.provider_names()
        chain_name = default.name
        stream_mode = default.stream_mode
        chain_backstop = default.mock_backstop
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
    backstop = request.backstop or chain_backstop
    return Plan(
        router_mode=mode,
        candidates=_dedup_mock_last(entries, add_mock=backstop),
        chain_name=chain_name,
        rule=rule_name,
        requested_provider=request.provider,
        configured=bool(entries),
        stream_mode=stream_mode,
        backstop=backstop,
    )


def _mock_config(row: Provider | None) -> ProviderConfig:
    if row is not None:
        config = row.to_config()
        # The backstop is always available and always offline.
        return replace(config, kind="mock", mode="mock", enabled=True)
    return ProviderConfig(
        name=MOCK_PROVIDER_NAME, kind="mock", model=routing_settings.MOCK_MODEL, mode="mock"
    )


def _denied(plan: Plan, request: AuditRequest, config: ConfigSnapshot) -> frozenset[str]:
    """The plan's candidates this request's caller may not use (``not_allowed``)."""
    return denied_candidates(
        principal=request.principal,
        names=plan.names,
        chain_name=plan.chain_name,
        requested_provider=plan.requested_provider,
        forced=plan.router_mode == "forced",
        config=config,
    )


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
        if name == MOCK_PROVIDER_NAME:
            # The backstop always answers: the built-in mock stands in for a "mock"
            # kind override that cannot be imported.
            return MockProvider(config)
        return None


@dataclass
class _Walk:
    request_id: str
    attempts: list[AttemptRecord] = field(default_factory=list)

    def add(self, **kwargs: object) -> AttemptRecord:
        attempt = AttemptRecord(index=len(self.attempts), **kwargs)  # type: ignore[arg-type]
        self.attempts.append(attempt)
        return attempt


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
        "usage": result.usage,
    }


def _skip_result(
    name: str, model: str, reason: str, *, capability: str | None = None
) -> ProviderResult:
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
            "unsupported": f"The provider does not support {capability or 'a capability'}, "
            "which this request needs.",
            "circuit_open": "The provider's circuit is open.",
            "not_allowed": "You may not route to this provider.",
            "budget_exhausted": "The request-wide deadline or attempt budget is used up.",
        }.get(reason, reason)
    return ProviderResult(
        provider=name,
        model=model,
        mode=mode,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        error=ErrorInfo(category=reason, message=message),
    )


AttemptFn = Callable[[BaseProvider], Steps[ProviderResult]]

#: Row params that set a provider's output length (both are ceilings).
OUTPUT_PARAMS = ("max_tokens", "max_completion_tokens")


def _row_max_tokens(config: ProviderConfig) -> int | None:
    values = [
        v
        for k in OUTPUT_PARAMS
        if isinstance(v := (config.params or {}).get(k), int) and not isinstance(v, bool) and v > 0
    ]
    return min(values) if values else None


def with_output_ceiling(request: AuditRequest, config: ProviderConfig) -> AuditRequest:
    """The request as this candidate may send it: the ``max_tokens`` asked for (the
    client's, else the row's own) never above the row's params nor ``MAX_OUTPUT_TOKENS``.
    Applied per candidate, before any adapter builds a payload."""
    row = _row_max_tokens(config)
    ceiling_setting = routing_settings.MAX_OUTPUT_TOKENS
    ceilings = [c for c in (row, int(ceiling_setting) if ceiling_setting else None) if c]
    wanted = request.max_tokens if request.max_tokens is not None else row
    if wanted is None or not ceilings or wanted <= min(ceilings):
        return request
    return replace(request, max_tokens=min(ceilings))


@dataclass(frozen=True)
class _Setup:
    """What a session reads from the configuration before its walk."""

    plan: Plan
    rows: dict[str, Provider]
    denied: frozenset[str]  # candidates the caller may not use (not_allowed)


def _setup(request: AuditRequest, config: ConfigSnapshot) -> _Setup:
    """What one routed request needs of the configuration, from the in-process snapshot
    (no database read: llm_routing.snapshot)."""
    plan = resolve(request, config)
    return _Setup(plan=plan, rows=config.rows(plan.names), denied=_denied(plan, request, config))


def _off_loop(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """How the async drivers run their blocking database calls (``_setup``, ``Record``):
    in a worker thread, never on the event loop. (tests/drivers.py runs them in the
    test's thread instead, where its transaction lives.) The worker's database
    connection is then handled as at the end of a request (``CONN_MAX_AGE``), so
    worker threads do not pile up open connections."""

    def in_worker(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(in_worker, thread_sensitive=False)


@dataclass(frozen=True, slots=True)
class Setup(Effect):
    """The session's configuration reads (:func:`_setup`) → _Setup."""

    request: AuditRequest

    def run(self, ctx: Context) -> _Setup:
        setup = _setup(self.request, current())
        release_pooled_connections()  # no pooled connection held across upstream calls
        return setup

    async def arun(self, ctx: Context) -> _Setup:
        # The snapshot answers from memory; a due check or rebuild runs off the loop.
        return _setup(self.request, await acurrent())


@dataclass(frozen=True, slots=True)
class Record(Effect):
    """Record the decision and its attempts → None (never raises; spools on a DB error)."""

    request: AuditRequest
    routed: RoutingResult

    def run(self, ctx: Context) -> None:
        if ctx.finalizing:  # a dropped stream's finalizer: never the database here
            recorder.submit(self.request, self.routed)
        else:
            recorder.record_or_spool(self.request, self.routed)

    async def arun(self, ctx: Context) -> None:
        if routing_settings.RECORD_MODE == "write_behind" or ctx.finalizing:
            recorder.submit(self.request, self.routed)  # a bounded queue: never blocks
        else:
            await _off_loop(recorder.record_or_spool)(self.request, self.routed)


@dataclass(frozen=True, slots=True)
class Announce(Effect):
    """Send ``request_routed`` → None: the budgets' settlement with the usage the
    upstream reported and the release of the place in flight, metrics, traces. On the
    event loop it awaits what its receivers deferred (the settlement task), so a loop
    that stops right after the request cannot lose the charge."""

    request: AuditRequest
    routed: RoutingResult

    def run(self, ctx: Context) -> None:
        send(request_routed, request_id=self.routed.request_id, request=self.request,
             routed=self.routed)  # fmt: skip

    async def arun(self, ctx: Context) -> None:
        await asend(request_routed, request_id=self.routed.request_id, request=self.request,
                    routed=self.routed)  # fmt: skip


def _gone_error() -> ClientDisconnectedError:
    return ClientDisconnectedError()


class _Session:
    """One routed request: its plan, walk, budget; shared by every driver. Its methods
    are generators of effects (:mod:`llm_routing.effects`)."""

    def __init__(
        self,
        request: AuditRequest,
        setup: _Setup,
        *,
        request_id: str | None,
        started: float,
    ) -> None:
        self.started = started
        self.request = request
        self.walk = _Walk(request_id=request_id or str(uuid.uuid4()))
        self.plan = setup.plan
        self.rows = setup.rows
        self.budget = Budget(
            deadline_s=float(routing_settings.REQUEST_DEADLINE_S),
            max_attempts=int(routing_settings.MAX_ATTEMPTS),
        )
        # Candidates the caller may not use: skipped as not_allowed (docs/operations.md).
        self.denied = setup.denied
        # Set by the one exit (:meth:`finish`), which runs once.
        self.routed: RoutingResult | None = None

    @property
    def request_id(self) -> str:
        return self.walk.request_id

    def skip(
        self,
        name: str,
        row: Provider | None,
        adapter: BaseProvider | None,
        budget: Budget | None,
        *,
        forced: bool = False,
        needs: frozenset[str] = frozenset(),
    ) -> Steps[str | None]:
        """:func:`~llm_routing.availability.may_try` for this request (its caller's
        access rules), claiming the circuit (a half-open probe slot)."""
        return (
            yield from may_try(
                name,
                row,
                adapter,
                self.request,
                denied=self.denied,
                budget=budget,
                forced=forced,
                needs=needs,
            )
        )

    def call(
        self,
        adapter: BaseProvider,
        request: AuditRequest | None = None,
        invoke: InvokeSteps | None = None,
        *,
        defer_success: bool = False,
    ) -> Steps[ProviderResult]:
        """One candidate through the retry layer, with hooks and breaker bookkeeping.

        ``defer_success``: an opened stream is not a success yet — the caller feeds the
        breaker once the stream has ended (:func:`_settle`)."""
        request = with_output_ceiling(request or self.request, adapter.config)
        config = adapter.config
        send(
            before_provider_call,
            request_id=self.request_id,
            provider=config.name,
            model=config.model,
            task=request.task,
        )
        # A half-open probe is exactly one upstream request.
        max_retries = 0 if breaker.is_probe(config) else None
        try:
            result = yield from retry_steps(
                adapter, request, budget=self.budget, invoke=invoke, max_retries=max_retries
            )
        except ClientGone:
            # Cut short by the client (async drivers): never counted, frees a probe slot.
            gone = error_result(
                adapter, _gone_error(), latency_ms=0.0, retries=0, upstream_requests=1
            )
            yield Observe(config, gone)
            self.walk.add(**_attempt_record(gone, served=False))
            raise
        result = sanitized(result, request)
        if not (defer_success and result.ok):
            try:
                yield Observe(config, result)
            except ClientGone:  # cancelled here: the answer (and its usage) still counts
                self.walk.add(**_attempt_record(result, served=False))
                raise
        send(after_provider_result, request_id=self.request_id, provider=config.name, result=result)
        return result

    def gone(self) -> ProviderResult:
        """The final result of a request whose client went away before its answer."""
        last = self.walk.attempts[-1] if self.walk.attempts else None
        return ProviderResult(
            provider=last.provider if last else "",
            model=last.model if last else "",
            mode="error",
            status="error",
            error=_gone_error().to_info(),
        )

    def run(self, attempt: AttemptFn) -> Steps[tuple[ProviderResult, str | None]]:
        if self.plan.router_mode == "forced":
            return (yield from self._forced(attempt))
        return (yield from self._walk_chain(attempt))

    def _forced(self, attempt: AttemptFn) -> Steps[tuple[ProviderResult, str | None]]:
        """Exactly the forced provider: no skipping, no mock substitution."""
        request = self.request
        name = self.plan.names[0]
        row = self.rows.get(name)
        adapter = _adapter_for(name, "", row)
        # Forced mode never substitutes the mock, but it respects the access rules, the
        # attempt budget and the circuit: an open circuit answers circuit_open without
        # a call; a half-open one lets the forced call be its single probe.
        reason = yield from self.skip(name, row, adapter, self.budget, forced=True)
        if reason is not None or adapter is None:
            reason = reason or "unknown_provider"
            model = row.model if row else ""
            self.walk.add(provider=name, model=model, outcome="skipped", reason=reason)
            capability = missing_capability(adapter, request) if adapter is not None else None
            return _skip_result(name, model, reason, capability=capability), None
        result = yield from attempt(adapter)
        self.walk.add(**_attempt_record(result, served=result.ok))
        return result, None

    def _walk_chain(self, attempt: AttemptFn) -> Steps[tuple[ProviderResult, str | None]]:
        plan, walk = self.plan, self.walk
        first_reason: str | None = None
        any_attempted = False
        for position, (name, model) in enumerate(plan.candidates):
            row = self.rows.get(name)
            adapter = _adapter_for(name, model, row)
            reason = yield from self.skip(name, row, adapter, self.budget)
            if reason is not None or adapter is None:
                reason = reason or "unknown_provider"
                shown_model = model or (row.model if row else "")
                walk.add(provider=name, model=shown_model, outcome="skipped", reason=reason)
                first_reason = first_reason or reason
                send(on_provider_fallback, request_id=walk.request_id, provider=name, reason=reason)
                continue
            is_backstop = name == MOCK_PROVIDER_NAME and position == len(plan.candidates) - 1
            result = yield from attempt(adapter)
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
            if not (result.error is None or result.error.advances):
                return result, first_reason if position > 0 else None
            send(on_provider_fallback, request_id=walk.request_id, provider=name, reason=category)
        # Every candidate was skipped or failed: reachable when the plan has no mock
        # backstop (``backstop=False``, e.g. /v1) or the backstop itself failed.
        last = walk.attempts[-1] if walk.attempts else None
        if plan.backstop:
            error = ResponseError("Every candidate failed, the mock backstop included.").to_info()
        else:
            error = ErrorInfo(
                category="chain_exhausted",
                message="Every candidate was skipped or failed, and this chain has no mock "
                "backstop.",
                transient=True,
            )
        return (
            ProviderResult(
                provider=last.provider if last else "",
                model=last.model if last else "",
                mode="error",
                status="error",
                error=error,
            ),
            "chain_exhausted",
        )

    def failed(self, exc: BaseException) -> ProviderResult:
        """The final result of a walk that raised where nothing should (a bug, a hook):
        an error result, so the request still ends through :meth:`finish`."""
        logger.error(
            "Routing request %s failed unexpectedly (%s); recorded as an error.",
            self.request_id,
            type(exc).__name__,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        last = self.walk.attempts[-1] if self.walk.attempts else None
        return ProviderResult(
            provider=last.provider if last else "",
            model=last.model if last else "",
            mode="error",
            status="error",
            error=ResponseError(
                f"The router failed unexpectedly ({type(exc).__name__})."
            ).to_info(),
        )

    def finish(
        self, final: ProviderResult, fallback_reason: str | None, *, persist: bool
    ) -> Steps[RoutingResult]:
        """The one exit of every request that reached the walk (both drivers, stream or
        not): record the decision (``Record``: inline, spooled, or queued for the
        write-behind writer), then announce it (``request_routed``: the budget's
        settlement with the usage the upstream reported and the release of the place in
        flight, metrics, traces). Exactly once: a second call returns the first's
        result. Nothing raised before or inside it stops it: a recording failure (the
        recorder, an encoding error) is logged and the request is still announced (so
        still charged); a receiver that raises is logged (:func:`signals.send`); a
        client gone or a cancellation during the record still announces it."""
        if self.routed is not None:
            return self.routed
        plan = self.plan
        try:
            final = sanitized(final, self.request)
        except Exception as exc:  # never lose the exit to the filter: a bare error then
            final = self.failed(exc)
        metadata = RoutingMetadata(
            request_id=self.request_id,
            router_mode=plan.router_mode,
            route=self.request.route,
            rule=plan.rule,
            chain_name=plan.chain_name,
            requested_provider=plan.requested_provider,
            selected_provider=final.provider,
            chain=plan.names,
            attempts=tuple(self.walk.attempts),
            fallback_used=fallback_reason is not None,
            fallback_reason=fallback_reason,
        )
        routed = self.routed = RoutingResult(
            request_id=self.request_id,
            result=final,
            metadata=metadata,
            total_latency_ms=(time.perf_counter() - self.started) * 1000,
        )
        announce = Announce(self.request, routed)
        try:
            if persist:
                try:
                    yield Record(self.request, routed)
                except Exception as exc:  # then the write-behind queue (or its spool)
                    logger.error(
                        "Could not record routing decision %s inline (%s); queued.",
                        self.request_id,
                        type(exc).__name__,
                    )
                    recorder.submit(self.request, routed)  # never raises
        except BaseException:  # torn down at the record (ClientGone): queue, announce
            if persist:
                recorder.submit(self.request, routed)  # idempotent: request_id is unique
            announce.run(Context())
            raise
        logger.info(
            "routed request_id=%s task=%s mode=%s selected=%s status=%s fallback=%s",
            self.request_id,
            self.request.task,
            plan.router_mode,
            final.provider,
            final.status,
            fallback_reason,
        )
        try:
            yield announce
        except Exception:  # the effect failed: send it here, synchronously
            announce.run(Context())
        except BaseException:  # torn down at the announcement: send it here
            announce.run(Context())
            raise
        return routed


def _route(request: AuditRequest, request_id: str | None, persist: bool) -> Steps[RoutingResult]:
    """The whole of :func:`route` / :func:`aroute`."""
    started = time.perf_counter()
    session = _Session(request, (yield Setup(request)), request_id=request_id, started=started)
    try:
        final, fallback_reason = yield from session.run(session.call)
    except ClientGone:  # cancelled (async driver): the decision is still recorded
        yield from session.finish(session.gone(), None, persist=persist)
        raise
    except Exception as exc:  # a bug or a hook: still one exit, and no 500
        final, fallback_reason = session.failed(exc), None
    return (yield from session.finish(final, fallback_reason, persist=persist))


def route(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Sleeper | None = None,
    persist: bool = True,
) -> RoutingResult:
    """Route one request and record it. Never raises on a well-formed request."""
    return effects.run(_route(request, request_id, persist), sleeper=sleeper)


async def aroute(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: AsyncSleeper | None = None,
    persist: bool = True,
) -> RoutingResult:
    """:func:`route` for the event loop (the same walk, driven with awaits);
    ``sleeper`` is an async callable. Cancelled, it still records the decision."""
    return await effects.arun(_route(request, request_id, persist), sleeper=sleeper)


# --- explain (read-only) --------------------------------------------------------------


def explain(request: AuditRequest) -> Explanation:
    """What :func:`route` would do with ``request`` now, without calling any provider,
    recording anything or touching circuit state (no half-open probe slot is claimed).

    The same :func:`resolve` and :func:`~llm_routing.availability.may_try` as the walk;
    the circuit is read (``PeekCircuit``) instead of claimed (``Allow``). What it
    cannot foresee: a provider failing, and the budget running out after earlier
    attempts (every verdict assumes a fresh budget).
    """
    snap = current()
    plan = resolve(request, snap)
    rows = snap.rows(plan.names)
    forced = plan.router_mode == "forced"
    denied = _denied(plan, request, snap)
    out: list[CandidateExplanation] = []
    for position, (name, model) in enumerate(plan.candidates):
        row = rows.get(name)
        adapter = _adapter_for(name, model, row)
        # The walk's own decision, the circuit read without claiming a probe slot.
        reason = effects.run(
            may_try(name, row, adapter, request, denied=denied, forced=forced, claim=False)
        )
        shown_model = model or (adapter.config.model if adapter else (row.model if row else ""))
        if adapter is None:
            out.append(
                CandidateExplanation(
                    position, name, shown_model, "skip", reason or "unknown_provider"
                )
            )
            continue
        config = adapter.config
        look = breaker.peek(config)
        circuit = look.circuit
        out.append(
            CandidateExplanation(
                position=position,
                provider=name,
                model=shown_model,
                verdict="skip" if reason else "try",
                reason=reason,
                missing_capability=(
                    missing_capability(adapter, request) if reason == "unsupported" else None
                ),
                circuit=look.phase if look.tracked else "n/a",
                open_until=circuit.open_until if circuit and look.phase != breaker.CLOSED else None,
                probe=look.probe and reason is None,
                timeout_s=float(config.timeout_s),
                first_token_timeout_s=float(config.first_token_timeout_s),
                max_retries=0 if look.probe else int(config.max_retries),
                backstop=name == MOCK_PROVIDER_NAME and position == len(plan.candidates) - 1,
            )
        )
    return Explanation(
        plan=plan,
        candidates=tuple(out),
        deadline_s=float(routing_settings.REQUEST_DEADLINE_S),
        max_attempts=int(routing_settings.MAX_ATTEMPTS),
    )


# --- streaming ----------------------------------------------------------------------

#: direct: fail over only before the first chunk; after it, an error event.
#: atomic: buffer the whole answer, then stream it (any failure can still fail over).
#: continuation: after a mid-stream failure, a later candidate declaring prefill
#: support continues the delivered text.
STREAM_MODES = ("direct", "atomic", "continuation")


def route_stream(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: Sleeper | None = None,
    persist: bool = True,
    stream_mode: str | None = None,
) -> Iterator[RouterStreamEvent]:
    """Route one request as a stream of StreamChunk events ending in exactly one
    StreamResult (complete answer, or a pre-commit error result) or StreamFailure
    (a failure after text was delivered: ``partial`` is true, nothing is replayed).

    The commit point is the first chunk handed to the caller: before it, every failure
    may fail over; after it, only the ``continuation`` mode may, and only to a
    provider that declares prefill support. Nothing runs before the first ``next()``.
    """
    core = _route_stream(request, request_id, stream_mode, persist)
    return effects.stream(core, sleeper=sleeper)


def aroute_stream(
    request: AuditRequest,
    *,
    request_id: str | None = None,
    sleeper: AsyncSleeper | None = None,
    persist: bool = True,
    stream_mode: str | None = None,
) -> AsyncIterator[RouterStreamEvent]:
    """:func:`route_stream` for the event loop (the same walk, driven with awaits): an
    async generator. ``aclose()`` or a cancellation records the decision with the
    attempt marked ``client_disconnected``, closes the upstream stream and frees a
    probe slot."""
    core = _route_stream(request, request_id, stream_mode, persist)
    return effects.astream(core, sleeper=sleeper)


#: A live stream: the driver's opaque handle and the events read before the commit point.
_Live = tuple[Any, list[StreamEvent]]


def _route_stream(
    request: AuditRequest, request_id: str | None, stream_mode: str | None, persist: bool
) -> Steps[None]:
    """The whole of :func:`route_stream` / :func:`aroute_stream`: its events to the
    caller are ``Emit`` effects. Whatever raises in the walk, the request ends through
    the session's one exit and the stream with its one final event."""
    started = time.perf_counter()
    session = _Session(request, (yield Setup(request)), request_id=request_id, started=started)
    mode = stream_mode or session.plan.stream_mode
    outcome = _StreamOutcome()
    delivered: list[str] = []
    guard = StreamGuard(request)  # the one key filter of everything this stream emits
    try:
        last = yield from _stream_walk(session, mode, persist, outcome, delivered, guard)
    except ClientGone:
        if session.routed is None:
            yield from session.finish(session.gone(), None, persist=persist)
        raise
    except Exception as exc:  # a bug or a hook: still one exit and one final event
        routed = yield from session.finish(session.failed(exc), None, persist=persist)
        error = routed.result.error
        if error is None:
            last = StreamResult(routed)
        else:
            last = StreamFailure(error=error, partial=outcome.committed(delivered), routed=routed)
    yield Emit(guard.final(last))


def _stream_walk(
    session: _Session,
    mode: str,
    persist: bool,
    outcome: _StreamOutcome,
    delivered: list[str],
    guard: StreamGuard,
) -> Steps[StreamResult | StreamFailure]:
    """The stream's walk, pump and exit; returns its final event (the caller emits it)."""
    request = session.request
    live: dict[str, _Live] = {}
    # Opened streams whose outcome the breaker has not seen yet (settled when they end).
    opened: dict[str, _Opened] = {}

    def opener(req: AuditRequest, buffer_all: bool) -> AttemptFn:
        def attempt(adapter: BaseProvider) -> Steps[ProviderResult]:
            def invoke(api_key: str | None, timeout: float) -> Steps[ProviderResult]:
                clamped = with_output_ceiling(req, adapter.config)
                events = yield OpenStream(adapter, clamped, api_key, timeout)
                head: list[StreamEvent] = []
                try:
                    # Failures here are pre-commit: they fail over.
                    while (event := (yield NextEvent(events))) is not None:
                        head.append(event)
                        if isinstance(event, StreamEnd) or (
                            not buffer_all
                            and (
                                isinstance(event, StreamToolCallDelta)
                                or (isinstance(event, StreamDelta) and event.text)
                            )
                        ):
                            break
                    if not head or (buffer_all and not isinstance(head[-1], StreamEnd)):
                        # A truncated transfer, still pre-commit: transient, so it fails over.
                        raise NetworkError("The stream ended before it finished.")
                except (Exception, ClientGone):
                    yield CloseStream(events)
                    raise
                live[adapter.config.name] = (events, head)
                opened[adapter.config.name] = (adapter.config, timeout)
                return ProviderResult(
                    provider=adapter.config.name,
                    model=adapter.config.model,
                    mode=adapter.result_mode,  # type: ignore[arg-type]
                    status="ok",
                )

            return (yield from session.call(adapter, req, invoke, defer_success=True))

        return attempt

    try:
        final, fallback_reason = yield from session.run(opener(request, mode == "atomic"))
    except ClientGone:  # cancelled before the commit point (async drivers)
        outcome.failure = _gone_error()
        final = session.gone()
        for events, _ in live.values():
            yield CloseStream(events)
        for entry in opened.values():
            yield from _settle(session, entry, final, outcome)
        yield from session.finish(final, None, persist=persist)
        raise
    if not final.ok or final.provider not in live:
        routed = yield from session.finish(final, fallback_reason, persist=persist)
        return StreamResult(routed)

    try:
        served = session.walk.attempts[-1]
        yield from _pump(live.pop(final.provider), delivered, outcome, served, guard)
        yield from _settle(session, opened.pop(final.provider, None), final, outcome)
        if (
            outcome.failure is not None
            and mode == "continuation"
            and delivered
            and not outcome.tool_deltas  # a prefill cannot continue a half tool call
        ):
            yield from _continue(session, opener, live, opened, delivered, outcome, guard)
    except ClientGone:
        outcome.failure = _gone_error()
        raise
    finally:
        for events, _ in live.values():
            yield CloseStream(events)
        for entry in opened.values():  # cut short by the client: frees a probe slot
            yield from _settle(session, entry, final, outcome)
        routed = yield from _finish_stream(
            session, final, fallback_reason, delivered, outcome, persist
        )
    if outcome.failure is None:
        return StreamResult(routed)
    info = scrub_error((outcome.original or outcome.failure).to_info(), request)
    return StreamFailure(error=info, partial=outcome.committed(delivered), routed=routed)


@dataclass
class _StreamOutcome:
    end: StreamEnd | None = None
    failure: ProviderError | None = None
    original: ProviderError | None = None  # the first mid-stream failure (continuation)
    served_by: str | None = None
    # Tool-call fragments delivered (a commit point like text), in order.
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)

    def committed(self, delivered: list[str]) -> bool:
        """Whether anything (text or a tool-call fragment) reached the caller."""
        return bool(delivered) or bool(self.tool_deltas)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The stream's tool calls: the adapter's assembled list from its StreamEnd,
        else assembled here from the fragments that were delivered."""
        if self.end is not None and self.end.tool_calls:
            return self.end.tool_calls
        return assemble_tool_calls(self.tool_deltas)


def _deliver(chunk: StreamChunk, delivered: list[str], outcome: _StreamOutcome) -> Emit:
    """A chunk that has passed the stream's key filter, as it leaves (and as it counts
    toward the answer: the text delivered, the tool-call fragments delivered)."""
    if chunk.tool_call is not None:
        outcome.tool_deltas.append(chunk.tool_call)
    if chunk.text:
        delivered.append(chunk.text)
    return Emit(chunk)


def _pump(
    source: _Live,
    delivered: list[str],
    outcome: _StreamOutcome,
    served: AttemptRecord,
    guard: StreamGuard,
) -> Steps[None]:
    """Hand a live stream's events to the caller (``Emit``, each through the stream's
    one key filter ``guard``) until its end, then close it."""
    events, head = source
    outcome.end, outcome.failure = None, None
    queued = iter(head)
    try:
        while True:
            event = next(queued, None)
            if event is None and (event := (yield NextEvent(events))) is None:
                break
            if isinstance(event, StreamEnd):
                outcome.end = event
                break
            if isinstance(event, StreamToolCallDelta):
                chunk = StreamChunk(
                    "", provider=served.provider, model=served.model, tool_call=event.delta
                )
            elif isinstance(event, StreamDelta):
                chunk = StreamChunk(event.text, provider=served.provider, model=served.model)
            else:
                continue
            if (clean := guard.chunk(chunk)) is not None:
                yield _deliver(clean, delivered, outcome)
        if outcome.end is None:
            outcome.failure = ResponseError("The stream was cut before it finished.")
    except ProviderError as exc:
        outcome.failure = redacted(exc)
    except Exception as exc:
        logger.exception("Stream adapter raised %s", type(exc).__name__)
        outcome.failure = ResponseError(f"The stream failed ({type(exc).__name__}).")
    except ClientGone:
        yield CloseStream(events)
        raise
    yield CloseStream(events)
    for rest in guard.flush(served.provider, served.model):
        yield _deliver(rest, delivered, outcome)


#: An opened stream: the config it was called with and the timeout it was given.
_Opened = tuple[ProviderConfig, float]


def _settle(
    session: _Session, entry: _Opened | None, opened: ProviderResult, outcome: _StreamOutcome
) -> Steps[None]:
    """Feed an opened stream's real outcome to the breaker, under the model it was
    called with (a chain entry's override included): its success only once it ended
    cleanly, its failure after the commit point as a failure — unless it is a timeout
    only the request deadline caused (then ``budget_exhausted``, as before the commit
    point, and not charged)."""
    if entry is None:
        return
    config, timeout = entry
    failure = outcome.failure
    if failure is None:
        yield Observe(config, opened)
        return
    failure = outcome.failure = deadline_caused(
        failure, timeout=timeout, own_timeout=config.timeout_s, budget=session.budget
    )
    error = failure.to_info()
    yield Observe(config, replace(opened, mode="error", status="error", error=error))


def _continue(
    session: _Session,
    opener: Callable[[AuditRequest, bool], AttemptFn],
    live: dict[str, _Live],
    opened: dict[str, _Opened],
    delivered: list[str],
    outcome: _StreamOutcome,
    guard: StreamGuard,
) -> Steps[None]:
    """Mid-stream failure in continuation mode: one later candidate with prefill
    support continues the delivered text. A fallback that fails (or rejects the
    prefill) never masks the original failure."""
    original = outcome.failure
    assert original is not None
    served = session.walk.attempts[-1]
    session.walk.attempts[-1] = replace(
        served,
        outcome="error",
        served=False,
        partial=True,
        reason=original.category,
        error_category=original.category,
        http_status=original.http_status,
        transient=original.transient,
    )
    names = session.plan.names
    after = names[names.index(served.provider) + 1 :] if served.provider in names else ()
    request = replace(session.request, prefill="".join(delivered))
    for name in after:
        row = session.rows.get(name)
        adapter = _adapter_for(name, "", row)
        prefill = frozenset({"prefill"})
        if (yield from session.skip(name, row, adapter, None, needs=prefill)) is not None:
            continue
        assert adapter is not None  # may_try says unknown_provider without one
        result = yield from opener(request, False)(adapter)
        session.walk.add(**_attempt_record(result, served=result.ok))
        if not result.ok or name not in live:
            break
        yield from _pump(live.pop(name), delivered, outcome, session.walk.attempts[-1], guard)
        yield from _settle(session, opened.pop(name, None), result, outcome)
        if outcome.failure is None:
            outcome.served_by = name
            return
        break
    outcome.original = original
    outcome.failure = outcome.failure or original


def _stream_data(request: AuditRequest, text: str) -> Any:
    """The parsed structured answer of a complete stream, as ``route`` returns it."""
    if request.response_schema is None:
        return None
    try:
        return validate_structured(text, request.response_schema)
    except ResponseError:
        return None


def _finish_stream(
    session: _Session,
    final: ProviderResult,
    fallback_reason: str | None,
    delivered: list[str],
    outcome: _StreamOutcome,
    persist: bool,
) -> Steps[RoutingResult]:
    attempts = session.walk.attempts
    last = attempts[-1]
    failure = outcome.failure
    end = outcome.end
    if failure is not None and end is not None and end.usage is not None:
        # The upstream finished and reported its usage, then the request was cut (the
        # client, a cancellation): that usage is charged all the same.
        last = attempts[-1] = replace(last, usage=end.usage)
    if failure is not None and not last.partial:
        attempts[-1] = replace(
            last,
            outcome="error",
            served=False,
            partial=outcome.committed(delivered),
            reason=failure.category,
            error_category=failure.category,
            http_status=failure.http_status,
            transient=failure.transient,
        )
    provider = outcome.served_by or final.provider
    if failure is None:
        result = replace(
            final,
            provider=provider,
            model=(end.model if end and end.model else attempts[-1].model),
            output="".join(delivered),
            data=_stream_data(session.request, "".join(delivered)),
            usage=(end.usage if end and end.usage else final.usage),
            finish_reason=end.finish_reason if end else None,
            tool_calls=outcome.tool_calls(),
        )
        if outcome.served_by:
            fallback_reason = fallback_reason or "continuation"
    else:
        error = (outcome.original or failure).to_info()
        result = replace(
            final, mode="error", status="error", output="".join(delivered), error=error
        )
    return (yield from session.finish(result, fallback_reason, persist=persist))
