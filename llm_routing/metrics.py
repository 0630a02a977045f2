"""Prometheus metrics (docs/observability.md).

Every family is fed from the :data:`~llm_routing.signals.request_routed` signal — one
routed request, its :class:`~llm_routing.types.RoutingResult` — except the circuit
gauge, which a collector reads from the breaker store at scrape time (read-only: no
probe slot is claimed).

Label values are bounded: provider names and models come from Provider rows (a name
that is not a row is ``other``; the model is the row's configured one), reasons and
categories from fixed sets (anything else is ``other``); never a request id or user
text.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (before the process
starts), each worker writes its values to files in that directory and a scrape adds
them up; gunicorn's ``child_exit`` hook must call
``prometheus_client.multiprocess.mark_process_dead(worker.pid)`` (the demo's
``gunicorn.conf.py`` does).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import pricing
from .types import SKIP_REASONS, AuditRequest, RoutingResult, Usage
from .version import __version__

__all__ = [
    "CIRCUIT_STATES",
    "ERROR_CATEGORIES",
    "FALLBACK_REASONS",
    "REGISTRY",
    "SKIP_REASONS",
    "CircuitCollector",
    "exposition",
    "observe",
]

#: ``llm_routing_circuit_state`` values.
CIRCUIT_STATES = {"closed": 0, "half_open": 1, "open": 2}

ERROR_CATEGORIES = frozenset(
    {
        "rate_limit",
        "unavailable",
        "network",
        "timeout",
        "budget_exhausted",
        "context_length",
        "authentication",
        "invalid_request",
        "content_policy",
        "response",
        "client_disconnected",
        "chain_exhausted",
    }
)
_SKIPS = frozenset(SKIP_REASONS)  # the availability decision's reasons (types.py)
FALLBACK_REASONS = ERROR_CATEGORIES | _SKIPS | {"no_chain", "continuation"}
OUTCOMES = frozenset({"ok", "fallback", "error"})
HEDGE_OUTCOMES = frozenset({"won", "lost", "failed", "skipped"})
#: Skips decided before the row was looked up: the name may be any caller's text.
UNCHECKED_SKIPS = frozenset({"not_allowed", "unknown_provider"})
OTHER = "other"

#: Seconds; LLM calls run from tens of milliseconds to minutes (OTel's GenAI advice).
DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
#: Tokens (OTel's GenAI advice: powers of 4).
TOKEN_BUCKETS = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

#: The app's own registry (not the process-global default one).
REGISTRY = CollectorRegistry(auto_describe=True)

PROVIDER_MODEL = ("provider", "model")
GEN_AI = ("gen_ai_provider_name", "gen_ai_request_model")

REQUESTS = Counter(
    "llm_routing_requests_total",
    "Routed requests by chain, router mode and outcome (ok, fallback, error).",
    ("chain", "router_mode", "outcome"),
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "llm_routing_request_duration_seconds",
    "Wall time of a routed request, every attempt and wait included.",
    ("chain", "router_mode", "outcome"),
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "llm_routing_attempts_total",
    "Provider attempts (retries inside one attempt are one) by outcome and error category.",
    (*PROVIDER_MODEL, "outcome", "error_category"),
    registry=REGISTRY,
)
SKIPS = Counter(
    "llm_routing_skips_total",
    "Candidates skipped without a call, by reason.",
    ("provider", "reason"),
    registry=REGISTRY,
)
PICKS = Counter(
    "llm_routing_picks_total",
    "Picks of a step of several candidates (docs/strategies.md): which candidate its "
    "strategy put first, and why.",
    ("chain", "step", "strategy", "provider", "reason"),
    registry=REGISTRY,
)
HEDGES = Counter(
    "llm_routing_hedges_total",
    "Hedged requests (docs/strategies.md) by outcome: won (the hedge answered first), "
    "lost (the first attempt did), failed (neither answered), skipped (a hedge was due "
    "but the deadline, the attempt budget or a cost cap could not afford it).",
    ("chain", "outcome"),
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "llm_routing_fallbacks_total",
    "Requests not served by their first candidate, by the first reason.",
    ("reason",),
    registry=REGISTRY,
)
TOKENS = Counter(
    "llm_routing_tokens_total",
    "Tokens the upstreams reported (failed attempts included), by type (input, output).",
    (*PROVIDER_MODEL, "token_type"),
    registry=REGISTRY,
)
COST = Counter(
    "llm_routing_cost_usd_total",
    "USD spent on attempts whose price is known (failed attempts that consumed tokens included).",
    PROVIDER_MODEL,
    registry=REGISTRY,
)
OPERATION_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "GenAI operation duration: one attempt (its retries included); error_type is empty on success.",
    (*GEN_AI, "error_type"),
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
TOKEN_USAGE = Histogram(
    "gen_ai_client_token_usage",
    "Tokens used per attempt, by type (input, output).",
    (*GEN_AI, "gen_ai_token_type"),
    buckets=TOKEN_BUCKETS,
    registry=REGISTRY,
)
TIME_TO_FIRST_CHUNK = Histogram(
    "gen_ai_client_operation_time_to_first_chunk_seconds",
    "Streams: time from the serving attempt's start to its first chunk.",
    GEN_AI,
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
#: 1 per process with metrics loaded; in multiprocess mode summed over the LIVE
#: workers (``livesum``: a dead worker's file leaves with gunicorn's ``child_exit``
#: hook), so it counts the workers exporting metrics, per version.
BUILD_INFO = Gauge(
    "llm_routing_build_info",
    "Processes exporting these metrics, by llm_routing version (live workers only).",
    ("version",),
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
BUILD_INFO.labels(__version__).set(1)


def _bounded(value: str | None, allowed: frozenset[str]) -> str:
    if not value:
        return ""
    return value if value in allowed else OTHER


class _Children:
    """A family's labelled children by label values: ``family.labels(...)`` validates
    and stringifies its arguments and takes a lock on every call, the dominant cost of
    :func:`observe`; a dict hit does not. Bounded (label values are bounded anyway):
    past :data:`CHILDREN_MAX` entries it starts again (the family keeps its children,
    so nothing counted is lost)."""

    __slots__ = ("children", "family")

    def __init__(self, family: Any) -> None:
        self.family = family
        self.children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            if len(self.children) >= CHILDREN_MAX:
                self.children.clear()
            child = self.children[values] = self.family.labels(*values)
        return child


#: Cached children per family (see :class:`_Children`).
CHILDREN_MAX = 4096

_requests = _Children(REQUESTS)
_request_duration = _Children(REQUEST_DURATION)
_attempts = _Children(ATTEMPTS)
_skips = _Children(SKIPS)
_fallbacks = _Children(FALLBACKS)
_picks = _Children(PICKS)
_hedges = _Children(HEDGES)
_tokens_total = _Children(TOKENS)
_cost = _Children(COST)
_operation_duration = _Children(OPERATION_DURATION)
_token_usage = _Children(TOKEN_USAGE)
_time_to_first_chunk = _Children(TIME_TO_FIRST_CHUNK)


def observe(request: AuditRequest, routed: RoutingResult) -> None:
    """Count one routed request."""
    meta, result = routed.metadata, routed.result
    attempts = meta.attempts
    # Both from per-process caches: the price sources per configuration snapshot,
    # the costs per routed request (the recorder has computed them already).
    sources = pricing.sources({a.provider for a in attempts})
    costs = pricing.costs(routed).attempts
    outcome = _bounded(result.status, OUTCOMES)
    total_s = routed.total_latency_ms / 1000
    request_labels = (meta.chain_name or "", meta.router_mode, outcome)
    _requests(*request_labels).inc()
    _request_duration(*request_labels).observe(total_s)
    if meta.fallback_used:
        _fallbacks(_bounded(meta.fallback_reason, FALLBACK_REASONS) or OTHER).inc()
    for pick in meta.picks:  # names from the chain's own entries: bounded
        if pick.get("picked"):
            _picks(
                meta.chain_name or "",
                str(pick["step"]),
                str(pick["strategy"]),
                str(pick["picked"]),
                str(pick["reason"]),
            ).inc()
    if meta.hedge is not None:
        _hedges(meta.chain_name or "", _bounded(meta.hedge, HEDGE_OUTCOMES) or OTHER).inc()
    earlier_ms = 0.0
    for attempt, cost in zip(attempts, costs, strict=True):
        source = sources.get(attempt.provider)
        model = source.model if source is not None else ""
        if attempt.outcome == "skipped":
            # A skip decided before the row was looked up may carry any caller's text.
            known = source is not None or attempt.reason not in UNCHECKED_SKIPS
            provider = attempt.provider if known else OTHER
            _skips(provider, _bounded(attempt.reason, _SKIPS) or OTHER).inc()
            continue
        if attempt.outcome == "hedge_skipped":  # no call: counted in llm_routing_hedges_total
            continue
        provider = attempt.provider  # attempted: it had a row (or is the mock)
        category = _bounded(attempt.error_category, ERROR_CATEGORIES)
        _attempts(provider, model, attempt.outcome, category).inc()
        seconds = attempt.latency_ms / 1000
        if request.stream and attempt.served:
            # A stream attempt ends at its first chunk (the commit point): its latency
            # is the time to first chunk; the operation lasts until the stream ended.
            _time_to_first_chunk(provider, model).observe(seconds)
            seconds = max(seconds, total_s - earlier_ms / 1000)
        earlier_ms += attempt.latency_ms
        _operation_duration(provider, model, category).observe(seconds)
        usage = result.usage if attempt.served else attempt.usage
        if usage is not None and (usage.input_tokens or usage.output_tokens):
            _tokens(provider, model, usage)
        if cost is not None and cost > 0:
            _cost(provider, model).inc(float(cost))


def _tokens(provider: str, model: str, usage: Usage) -> None:
    for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
        _tokens_total(provider, model, kind).inc(count)
        _token_usage(provider, model, kind).observe(count)


# --- circuit state, read at scrape time ------------------------------------------------


class CircuitCollector(Collector):
    """``llm_routing_circuit_state`` for every enabled live provider row and every chain
    entry's model override: 0 closed, 1 half-open, 2 open (``breaker.peek``)."""

    def collect(self) -> Iterator[Metric]:
        from .resilience import breaker

        gauge = GaugeMetricFamily(
            "llm_routing_circuit_state",
            "Circuit per (provider, model): 0 closed, 1 half-open, 2 open.",
            labels=PROVIDER_MODEL,
        )
        for config in _circuit_configs():
            look = breaker.peek(config)
            if look.tracked:
                gauge.add_metric((config.name, config.model), CIRCUIT_STATES[look.phase])
        yield gauge

    def describe(self) -> Iterable[Metric]:
        return []


def _circuit_configs() -> Iterator[Any]:
    from .models import ChainEntry, Provider

    seen: set[tuple[str, str]] = set()
    rows = {p.name: p for p in Provider.objects.filter(enabled=True)}
    pairs = [(name, "") for name in rows]
    pairs += list(
        ChainEntry.objects.filter(provider__name__in=rows)
        .exclude(model="")
        .values_list("provider__name", "model")
    )
    for name, model in pairs:
        config = rows[name].to_config()
        if model:
            config = config.with_model(model)
        if (config.name, config.model) not in seen:
            seen.add((config.name, config.model))
            yield config


REGISTRY.register(CircuitCollector())


def exposition() -> tuple[bytes, str]:
    """The scrape body and its content type (every worker's values in multiprocess
    mode)."""
    from prometheus_client import CONTENT_TYPE_LATEST, multiprocess

    if MULTIPROCESS:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(CircuitCollector())
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
