"""OpenTelemetry traces (docs/observability.md); a no-op without ``opentelemetry-api``
(the ``otel`` extra) or while no SDK tracer provider is configured.

One span per routed request (``llm_routing.route``), one child span per attempt
(``chat <model>``, or ``embeddings <model>`` for an embeddings request; kind CLIENT)
with the GenAI semantic-convention attributes ``gen_ai.operation.name``,
``gen_ai.provider.name`` (the provider row's name), ``gen_ai.request.model``,
``gen_ai.response.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``,
``error.type`` and ``llm_routing.retries``; each skipped candidate is an event
(``llm_routing.skip``) on the request span; the request id is the
``llm_routing.request_id`` attribute. Never a prompt, an answer or a key.

The spans are written when the request has been routed (``request_routed``), with the
real times recorded by the ``before_provider_call`` / ``after_provider_result`` /
``on_provider_fallback`` receivers; so nothing is attached to or detached from the
context inside the router, streams included. Their parent is the context current when
the request finishes: an incoming W3C ``traceparent`` (attached by
:class:`llm_routing.middleware.RequestIdMiddleware` through :func:`continued`), or
the span of an HTTP instrumentation that runs around the app.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import pricing
from .signals import after_provider_result, before_provider_call, on_provider_fallback
from .signals import request_routed as request_routed_signal
from .types import AuditRequest, ProviderResult, RoutingResult

try:  # the optional extra
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - exercised when the extra is absent
    trace = None  # type: ignore[assignment]

__all__ = ["AVAILABLE", "connect", "continued", "enabled", "extract"]

AVAILABLE = trace is not None
TRACER_NAME = "llm_routing"
_MAX_PENDING = 4096


@dataclass
class _Call:
    start: int
    model: str  # the model asked for (a chain entry's override included)
    end: int | None = None


@dataclass
class _Pending:
    """What the receivers saw of one request while it was routed."""

    calls: list[_Call] = field(default_factory=list)
    fallbacks: list[tuple[str, str, int]] = field(default_factory=list)


_pending: OrderedDict[str, _Pending] = OrderedDict()
_lock = threading.Lock()


_enabled_for: tuple[Any, bool] = (object(), False)  # (tracer provider, enabled)


def enabled() -> bool:
    """Whether spans would be recorded: the API is installed and an SDK provider set
    (answered from a cache while the global provider stays the same object)."""
    global _enabled_for
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    held = _enabled_for
    if held[0] is provider:
        return held[1]
    on = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    _enabled_for = (provider, on)
    return on


def extract(headers: Mapping[str, str]) -> Any:
    """The trace context an incoming request carries (``traceparent``), or None."""
    if trace is None or not enabled():
        return None
    if not any(k.lower() == "traceparent" for k in headers):
        return None
    return propagate.extract(headers)


@contextlib.contextmanager
def continued(parent: Any) -> Iterator[None]:
    """Make ``parent`` (from :func:`extract`) the current context inside."""
    if parent is None or trace is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


def _entry(request_id: str) -> _Pending:
    with _lock:
        entry = _pending.get(request_id)
        if entry is None:
            entry = _pending[request_id] = _Pending()
            while len(_pending) > _MAX_PENDING:  # a request that never finished
                _pending.popitem(last=False)
        return entry


def _on_call(sender: Any, *, request_id: str, model: str = "", **_: Any) -> None:
    if enabled():
        _entry(request_id).calls.append(_Call(start=time.time_ns(), model=model))


def _on_result(sender: Any, *, request_id: str, result: ProviderResult, **_: Any) -> None:
    if enabled():
        calls = _entry(request_id).calls
        if calls and calls[-1].end is None:
            calls[-1].end = time.time_ns()


def _on_fallback(sender: Any, *, request_id: str, provider: str, reason: str, **_: Any) -> None:
    if enabled():
        _entry(request_id).fallbacks.append((provider, reason, time.time_ns()))


def _on_routed(sender: Any, *, request: AuditRequest, routed: RoutingResult, **_: Any) -> None:
    with _lock:
        pending = _pending.pop(routed.request_id, None)
    if enabled():
        record(request, routed, pending or _Pending())


_cached: tuple[Any, Any] = (None, None)  # (tracer provider, its tracer)


def _tracer() -> Any:
    """The app's tracer, built once per tracer provider (get_tracer is not free)."""
    global _cached
    assert trace is not None
    provider = trace.get_tracer_provider()
    if _cached[0] is not provider:
        _cached = (provider, provider.get_tracer(TRACER_NAME))
    return _cached[1]


def record(request: AuditRequest, routed: RoutingResult, pending: _Pending) -> None:
    """Write the request span and its attempt spans (no attempt span when the sampler
    does not record the request span: with the SDK's default parent-based sampler its
    children would not be recorded either, so their attributes are not even built)."""
    assert trace is not None
    tracer = _tracer()
    meta, result = routed.metadata, routed.result
    end = time.time_ns()
    start = end - int(routed.total_latency_ms * 1_000_000)
    calls = pending.calls
    if calls:
        start = min(start, calls[0].start)
    cost = pricing.costs(routed).total
    attributes: dict[str, Any] = {
        "llm_routing.request_id": routed.request_id,
        "llm_routing.router_mode": meta.router_mode,
        "llm_routing.chain": meta.chain_name or "",
        "llm_routing.selected_provider": meta.selected_provider or "",
        "llm_routing.status": result.status,
        "llm_routing.fallback_used": meta.fallback_used,
        "llm_routing.stream": request.stream,
    }
    if meta.fallback_reason:
        attributes["llm_routing.fallback_reason"] = meta.fallback_reason
    if cost is not None:
        attributes["llm_routing.cost_usd"] = float(cost)
    span = tracer.start_span(
        "llm_routing.route", kind=SpanKind.INTERNAL, attributes=attributes, start_time=start
    )
    if not span.is_recording():  # sampled out: so would its children be (ParentBased)
        span.end(end_time=end)
        return
    parent = trace.set_span_in_context(span)
    skips = pending.fallbacks
    call_index = 0
    for attempt in meta.attempts:
        if attempt.outcome == "skipped":
            when = next(
                (t for p, r, t in skips if p == attempt.provider and r == attempt.reason), end
            )
            span.add_event(
                "llm_routing.skip",
                {
                    "gen_ai.provider.name": attempt.provider,
                    "llm_routing.reason": attempt.reason or "",
                },
                timestamp=when,
            )
            continue
        call = calls[call_index] if call_index < len(calls) else None
        call_index += 1
        first_chunk = call.end if call is not None else None
        # A served stream's call ends at its first chunk; the operation at the stream's end.
        streamed = request.stream and attempt.served
        child_end = end if streamed or first_chunk is None else first_chunk
        child_start = call.start if call is not None else end - int(attempt.latency_ms * 1e6)
        usage = result.usage if attempt.served else attempt.usage
        requested = (call.model if call is not None else "") or attempt.model
        # OTel's GenAI operation names: "embeddings" for an embeddings request.
        operation = "embeddings" if request.call == "embed" else "chat"
        child: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": attempt.provider,
            "gen_ai.request.model": requested,
            "gen_ai.response.model": attempt.model,
            "llm_routing.retries": attempt.retries,
            "llm_routing.request_id": routed.request_id,
            "llm_routing.outcome": attempt.outcome,
        }
        if usage is not None:
            child["gen_ai.usage.input_tokens"] = usage.input_tokens
            child["gen_ai.usage.output_tokens"] = usage.output_tokens
        if attempt.error_category:
            child["error.type"] = attempt.error_category
        attempt_span = tracer.start_span(
            f"{operation} {requested}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=child,
            start_time=child_start,
        )
        if streamed and first_chunk is not None:
            attempt_span.add_event("gen_ai.first_chunk", timestamp=first_chunk)
        if attempt.outcome == "error":
            attempt_span.set_status(Status(StatusCode.ERROR, attempt.error_category or "error"))
        attempt_span.end(end_time=child_end)
    if result.status == "error":
        span.set_status(Status(StatusCode.ERROR, result.error.category if result.error else ""))
    span.end(end_time=end)


def connect() -> None:
    """Connect the receivers (``LlmRoutingConfig.ready``; a no-op without the API)."""
    if trace is None:
        return
    before_provider_call.connect(_on_call, dispatch_uid="llm_routing.tracing.call")
    after_provider_result.connect(_on_result, dispatch_uid="llm_routing.tracing.result")
    on_provider_fallback.connect(_on_fallback, dispatch_uid="llm_routing.tracing.fallback")
    request_routed_signal.connect(_on_routed, dispatch_uid="llm_routing.tracing.routed")
